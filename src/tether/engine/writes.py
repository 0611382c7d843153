"""The record writes commands share: each saves a record and appends its event.

Every function takes the command's :class:`Unit` (which knows this environment's id) and
nothing else, so any command module can use them without holding the engine.
"""

from __future__ import annotations

from typing import Any

from tether.domain import access, runs
from tether.domain.records import Item, Message, Run, Task, Thread
from tether.domain.types import ItemKind, RunStatus
from tether.domain.views import item_view, message_view, run_view, task_view, thread_summary
from tether.engine.unit import Unit
from tether.ids import new_id

#: The parent environment of tasks an A2A client started (SPEC §14): the client's context
#: id stands in as the parent thread, and the client reads results over A2A.
A2A_PARENT = "a2a"


def new_thread(
    u: Unit,
    provider: str,
    title: str | None,
    token_id: str | None = None,
    parent: dict[str, Any] | None = None,
    task_id: str | None = None,
    model: str | None = None,
) -> Thread:
    thread = Thread(
        id=new_id("thr"),
        provider=provider,
        model=model,
        created_at=u.at,
        title=title,
        parent=parent,
        root_task_id=task_id,
        open_task_id=task_id,
        latest_task_id=task_id,
        token_id=token_id,
    )
    u.save(thread)
    u.emit("thread.created", thread_summary(thread, u.environment_id), thread_id=thread.id)
    return thread


def message(
    u: Unit,
    thread: Thread,
    role: str,
    text: str,
    source: dict[str, Any] | None = None,
    run_id: str | None = None,
) -> Message:
    thread.message_count += 1
    u.save(thread)
    record = Message(
        id=new_id("msg"),
        thread_id=thread.id,
        seq=thread.message_count,
        role=role,
        text=text,
        created_at=u.at,
        source=source,
        run_id=run_id,
    )
    u.save(record)
    u.emit("message.created", message_view(record), thread_id=thread.id, run_id=run_id)
    return record


def post(u: Unit, thread: Thread, text: str, source: dict[str, Any], kind: str, first: bool = False) -> Run:
    """A user or message trigger's message and the run that answers it."""
    record = message(u, thread, "user", text, source)
    return queue(u, thread, kind, [record], **({"first": True} if first else {}))


def queue(
    u: Unit,
    thread: Thread,
    kind: str,
    messages: list[Message],
    key: str | None = None,
    **extra: Any,
) -> Run:
    """Queue a run for ``kind`` — or fold the messages into a queued run that takes them."""
    run = next(
        (
            r
            for r in u.query(Run, thread_id=thread.id, status=RunStatus.QUEUED)
            if runs.folds_into(r, kind, key)
        ),
        None,
    )
    if run is None:
        thread.run_count += 1
        u.save(thread)
        trigger = {"kind": str(kind), "key": key, "messageIds": [], **extra}
        run = Run(new_id("run"), thread.id, thread.run_count, trigger, queued_at=u.at)
        event = "run.queued"
    else:
        event = "run.folded"
    run.trigger = {**run.trigger, "messageIds": run.trigger["messageIds"] + [m.id for m in messages]}
    for each in messages:
        each.run_id = run.id
        u.save(each)
    u.save(run)
    u.emit(event, run_view(run), thread_id=thread.id, run_id=run.id)
    u.mark(thread.id)
    return run


def save_task(u: Unit, task: Task, event: str = "task.updated") -> None:
    """Save ``task`` with its event, on the side of it that lives here (an A2A client's
    task is also pushed to its context's push configs)."""
    u.save(task)
    local = access.local_side(task, task.child_thread_id, u.environment_id)
    thread_id = task.child_thread_id if local else task.parent_thread_id
    u.emit(event, task_view(task), thread_id=thread_id, task_id=task.id)
    if task.parent_environment_id == A2A_PARENT and event != "task.delivery":
        _a2a_push(u, task)


def _a2a_push(u: Unit, task: Task) -> None:
    """Every change of an A2A task goes to its context's push configs (never dropped:
    outbox rows are retried with backoff and parked visibly, not deleted)."""
    root = task if task.follow_up_of is None else u.load(Task, task.follow_up_of)
    for config in root.push if root else []:
        u.outbox("a2a.push", {"taskId": task.id, "configId": config["id"]}, task.child_thread_id)


def task_item(u: Unit, task: Task, hold: bool) -> Item:
    """The background item a task is in its parent (here, the origin)."""
    item = Item(
        id=new_id("bg"),
        thread_id=task.parent_thread_id,
        kind=ItemKind.TASK,
        started_at=u.at,
        label=task.title,
        hold=hold,
        task_id=task.id,
        environment_id=task.child_environment_id,
        due_at=task.deadline_at,
    )
    # The deadline is armed here, in the parent's environment (the origin): it fires
    # even while a remote child's link is down, and the timer re-arms it after a restart.
    return start_item(u, item, "timer.arm" if task.deadline_at else None)


def start_item(u: Unit, item: Item, outbox: str | None = None) -> Item:
    """Record a new background item (and the side effect that starts it, carried out by
    the process the item belongs to, if it belongs to one)."""
    u.save(item)
    u.emit("item.started", item_view(item), thread_id=item.thread_id)
    if outbox:
        u.outbox(outbox, {"itemId": item.id, **on(item.member)}, item.thread_id)
    u.mark(item.thread_id)
    return item


def on(member: str | None) -> dict[str, str]:
    """An outbox payload's ``member``: the process that alone can carry the row out (stop
    its own turn, kill its own process); none when any process can (SPEC §12)."""
    return {"member": member} if member else {}
