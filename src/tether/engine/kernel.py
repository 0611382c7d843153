"""The reconcile kernel: what every command runs inside its unit, before it commits.

Runs queue and start one at a time per thread (``dispatch``), end (``end_run``), and
every thread a unit touched is reconciled (``settle``): its status and *settled* are
recomputed, and a settled child's last answer completes its task or opens a follow-up
(``answer``, G1), whose end wakes the parent once (``task_ended`` → ``wake``, G3).
Cancelling and stopping end runs, items and tasks through the same steps.

Functions here take the command's :class:`Unit` and change records only through the
pure rules of :mod:`tether.domain`.
"""

from __future__ import annotations

from typing import Any

from tether.domain import access, background, runs, tasks, threads
from tether.domain.records import Item, Message, Run, Task, Thread
from tether.domain.types import ACTIVE_RUN, Delivery, ItemKind, ItemStatus, RunStatus, Trigger
from tether.domain.views import item_view, message_view, run_view, thread_summary
from tether.engine.unit import Unit
from tether.engine.writes import message, on, queue, save_task, task_item
from tether.ids import new_id


def settle(u: Unit) -> None:
    """Before commit: dispatch and reconcile every touched thread until nothing moves."""
    while u.dirty:
        thread_id = next(iter(u.dirty))
        del u.dirty[thread_id]
        thread = u.load(Thread, thread_id)
        if thread is not None:
            reconcile(u, thread, dispatch(u, thread))


# ---------------------------------------------------------------------- runs


def dispatch(u: Unit, thread: Thread) -> list[Run] | None:
    """One run at a time per thread, in order: start the next queued run if none runs.
    The thread's active runs when it started none (``reconcile`` needs them too), else
    None: starting one may have changed them."""
    active = u.query(Run, thread_id=thread.id, status=list(ACTIVE_RUN))
    if any(run.status == RunStatus.RUNNING for run in active) or not active:
        return active
    run = runs.next_to_start(active)
    runs.start(run, u.at)
    u.save(run)
    u.emit("run.started", run_view(run), thread_id=thread.id, run_id=run.id)
    u.outbox("run.execute", {"runId": run.id}, thread.id)
    _on_run_started(u, thread, run)
    return None


def _on_run_started(u: Unit, thread: Thread, run: Run) -> None:
    if run.kind == Trigger.DELEGATED_TASK:
        advance(u, run.trigger.get("taskIds", []), Delivery.DELIVERED)
    if thread.root_task_id is None or run.is_progress:
        return
    task = u.load(Task, thread.open_task_id)
    if task is not None:
        tasks.mark_running(task)
        save_task(u, task)
    elif not thread.cancelled:
        follow_up = open_follow_up(u, thread)
        tasks.mark_running(follow_up)
        save_task(u, follow_up)


def end_run(u: Unit, run: Run, status: str, reply: str | None = None, error: str | None = None) -> None:
    started = run.started_at is not None
    runs.finish(run, status, u.at, reply, error)
    u.save(run)
    u.emit("run.ended", run_view(run), thread_id=run.thread_id, run_id=run.id)
    thread = u.need(Thread, run.thread_id, "thread")
    u.mark(thread.id)
    if run.kind == Trigger.DELEGATED_TASK and started:
        advance(u, run.trigger.get("taskIds", []), Delivery.ACKNOWLEDGED)
    if thread.root_task_id is None or not started:
        return
    if run.is_progress:
        task = u.load(Task, thread.open_task_id or thread.latest_task_id)
        if task is not None:
            tasks.note_progress(task, run)
            save_task(u, task)
        return
    thread.pending_answer_run_id = run.id
    u.save(thread)
    task = u.load(Task, thread.open_task_id)
    if task is not None:
        tasks.note_reply(task, run)
        save_task(u, task)


def supersede(u: Unit, thread: Thread) -> list[str]:
    """Stop the running run for a ``now`` message; unlike ``thread_interrupt`` the
    thread's open task is not marked interrupted, since the new run answers it."""
    stopped = []
    for run in u.query(Run, thread_id=thread.id, status=RunStatus.RUNNING):
        end_run(u, run, RunStatus.INTERRUPTED, run.reply, "stopped for a newer message")
        u.outbox("run.stop", {"runId": run.id}, thread.id)
        stopped.append(run.id)
    return stopped


# ---------------------------------------------------------------------- reconcile


def reconcile(u: Unit, thread: Thread, active: list[Run] | None = None) -> None:
    """The thread's status, its task's work state, and its answer once it settled (G1)."""
    if active is None:
        active = u.query(Run, thread_id=thread.id, status=list(ACTIVE_RUN))
    # Only whether something holds the thread matters: one held item is enough.
    items = u.query(Item, limit=1, thread_id=thread.id, held=True)
    settled = threads.is_settled(active, items)
    status = threads.status(active)
    if (thread.status, thread.settled) != (status, settled):
        thread.status, thread.settled = status, settled
        u.save(thread)
        u.emit("thread.updated", thread_summary(thread, u.environment_id), thread_id=thread.id)
    if thread.root_task_id is None:
        return
    task = u.load(Task, thread.open_task_id)
    if task is not None:
        state = threads.work_state(active, items)
        if task.work_state != state:
            task.work_state = state
            save_task(u, task)
    busy = bool(active) or u.count(Item, thread_id=thread.id, status=ItemStatus.RUNNING) > 0
    _note_child_active(u, thread, busy)  # before the answer: its event carries it
    if settled and not thread.cancelled and (thread.pending_answer_run_id or task):
        answer_run = u.load(Run, thread.pending_answer_run_id)
        thread.pending_answer_run_id = None
        u.save(thread)
        answer(u, thread, answer_run)
        _note_child_active(u, thread, busy)  # the answer may have opened a follow-up


def _note_child_active(u: Unit, thread: Thread, active: bool) -> None:
    """Mark the child's latest task while the child still has work that will wake it
    (a run, or any background work): a follow-up may yet come, so its parent is not
    done waiting even though the task ended (SPEC §10; mirrored to a remote origin)."""
    latest = u.load(Task, thread.latest_task_id)
    if latest is None or not access.local_side(latest, latest.child_thread_id, u.environment_id):
        return
    wanted = active and not thread.cancelled
    if latest.child_active == wanted:
        return
    latest.child_active = wanted
    save_task(u, latest)
    if wanted:  # a new stretch of work: no earlier task of this child stays marked
        for task in u.query(Task, child_thread_id=thread.id):
            if task.child_active and task.id != latest.id:
                task.child_active = False
                save_task(u, task)


def answer(u: Unit, thread: Thread, answer_run: Run | None) -> None:
    """The child settled: its last answer completes the open task or a new follow-up (G1)."""
    task = u.load(Task, thread.open_task_id) or open_follow_up(u, thread)
    tasks.complete(task, answer_run, u.at, interrupted=thread.interrupted)
    thread.open_task_id = None
    thread.interrupted = False
    u.save(thread)
    save_task(u, task, "task.completed")
    task_ended(u, task)


def open_follow_up(u: Unit, thread: Thread) -> Task:
    root = u.need(Task, thread.root_task_id or "", "task")
    follow_up = tasks.follow_up(root, new_id("tsk"), u.at)
    root.follow_ups.append(follow_up.id)
    save_task(u, root)
    thread.open_task_id = thread.latest_task_id = follow_up.id
    u.save(thread)
    save_task(u, follow_up, "task.created")
    if follow_up.parent_environment_id == u.environment_id:
        task_item(u, follow_up, hold=False)
    return follow_up


def follow_up_on_send(u: Unit, thread: Thread) -> None:
    """The parent wrote to its child after the task completed: a follow-up opens now,
    and the child's next answer completes it (SPEC §1 Follow-ups)."""
    if thread.open_task_id is None and not thread.cancelled:
        open_follow_up(u, thread)


# ---------------------------------------------------------------------- task endings, wakes


def task_ended(u: Unit, task: Task, by_parent: bool = False) -> None:
    """A task is terminal: end its item in the parent and deliver its result (G3)."""
    for item in u.query(Item, task_id=task.id, status=ItemStatus.RUNNING):
        background.end(item, tasks.item_end(task), u.at)
        u.save(item)
        u.emit("item.ended", item_view(item), thread_id=item.thread_id)
        u.mark(item.thread_id)
    if task.parent_environment_id != u.environment_id:
        return  # the origin environment delivers; it follows our event feed
    parent = u.load(Thread, task.parent_thread_id)
    if task.waiting_call:
        task.delivered_as = "call"
        tasks.advance_delivery(task, Delivery.CLAIMED)
        save_task(u, task, "task.delivery")
    elif by_parent or parent is None:
        tasks.advance_delivery(task, Delivery.DISPOSED)
        save_task(u, task, "task.delivery")
    else:
        wake(u, parent, task)


def wake(u: Unit, parent: Thread, task: Task) -> None:
    """One completion wake per result; results folding into a wake not yet started."""
    if task.delivery_state != Delivery.PENDING:
        return
    run = next(
        (
            r
            for r in u.query(Run, thread_id=parent.id, status=RunStatus.QUEUED)
            if runs.folds_into(r, Trigger.DELEGATED_TASK, None)
        ),
        None,
    )
    if run is not None:
        task_ids = [*run.trigger["taskIds"], task.id]
        run.trigger = {**run.trigger, "taskIds": task_ids}
        u.save(run)
        u.emit("run.folded", run_view(run), thread_id=parent.id, run_id=run.id)
        notice = u.need(Message, run.trigger["messageIds"][0], "message")
        # Appended, not rebuilt from every folded task: their parts never change (each
        # is terminal), and decoding them all made a big fan-in quadratic.
        notice.text = f"{notice.text}\n\n{tasks.wake_text([task])}"
        notice.source = {"kind": Trigger.DELEGATED_TASK, "taskIds": task_ids}
        u.save(notice)
        u.emit("message.updated", message_view(notice), thread_id=parent.id, run_id=run.id)
    else:
        source = {"kind": Trigger.DELEGATED_TASK, "taskIds": [task.id]}
        notice = message(u, parent, "notification", tasks.wake_text([task]), source)
        run = queue(u, parent, Trigger.DELEGATED_TASK, [notice], taskIds=[task.id])
    task.delivered_as = "follow-up" if task.follow_up_of else "result"
    task.wake_message_id, task.wake_run_id = notice.id, run.id
    tasks.advance_delivery(task, Delivery.CLAIMED)
    save_task(u, task, "task.delivery")


def advance(u: Unit, task_ids: list[str], to: Delivery) -> None:
    for task_id in task_ids:
        task = u.load(Task, task_id)
        if task is not None and tasks.advance_delivery(task, to):
            save_task(u, task, "task.delivery")


# ---------------------------------------------------------------------- cancel, stop


def cancel(u: Unit, task: Task, by_parent: bool, reason: str | None) -> None:
    """End an open task ``cancelled``: its child (here, and any task it still serves) is
    stopped, or — a remote child — the cancel is pushed to the peer."""
    tasks.cancel(task, u.at)
    task.waiting_call = False
    task.cancel_reason = reason
    save_task(u, task, "task.completed")
    local = access.local_side(task, task.child_thread_id, u.environment_id)
    child = u.load(Thread, task.child_thread_id) if local else None
    if child is not None:
        child.cancelled = True
        other = u.load(Task, child.open_task_id)
        child.open_task_id = child.pending_answer_run_id = None
        u.save(child)
        if other is not None and other.id != task.id and other.is_open:
            cancel(u, other, by_parent, reason)
        stop(u, child, reason or "task cancelled", RunStatus.CANCELLED, stop_all=True)
    else:
        task.remote_pending = "cancel"
        u.save(task)
        u.outbox("peer.push", {"environmentId": task.child_environment_id})
    task_ended(u, task, by_parent)


def stop(u: Unit, thread: Thread, reason: str, status: str, stop_all: bool) -> dict[str, Any]:
    """Stop the running run; with ``stop_all`` also the queued runs (not completion wakes)
    and every background item, cancelling the tasks among them."""
    stopped_runs = _stop_runs(u, thread, reason, status, stop_all)
    stopped_items = _stop_items(u, thread, reason) if stop_all else []
    if status == RunStatus.INTERRUPTED and (stopped_runs or stopped_items) and thread.open_task_id:
        thread.interrupted = True  # its task ends "interrupted", whatever the last reply
        u.save(thread)
    u.mark(thread.id)
    return {"threadId": thread.id, "stoppedRuns": stopped_runs, "stoppedItems": stopped_items}


def _stop_runs(u: Unit, thread: Thread, reason: str, status: str, stop_all: bool) -> list[str]:
    stopped = []
    for run in u.query(Run, thread_id=thread.id, status=list(ACTIVE_RUN)):
        if run.status == RunStatus.RUNNING:
            end_run(u, run, status, run.reply, reason)
            u.outbox("run.stop", {"runId": run.id, **on(run.member)}, thread.id)
        elif stop_all and run.kind != Trigger.DELEGATED_TASK:
            # A queued completion wake is delivery, not work: stopping the thread
            # must not drop the answers it carries (G1); it runs after the stop.
            end_run(u, run, RunStatus.CANCELLED, error=reason)
        else:
            continue
        stopped.append(run.id)
    return stopped


def _stop_items(u: Unit, thread: Thread, reason: str) -> list[str]:
    stopped = []
    for item in u.query(Item, thread_id=thread.id, status=ItemStatus.RUNNING):
        stopped.append(item.id)
        if item.kind == ItemKind.TASK:
            nested = u.load(Task, item.task_id)
            if nested is not None and nested.is_open:
                cancel(u, nested, True, reason)
                continue
        background.end(item, ItemStatus.CANCELLED, u.at, reason=reason)
        u.save(item)
        u.emit("item.ended", item_view(item), thread_id=thread.id)
        if item.kind in (ItemKind.COMMAND, ItemKind.MONITOR):
            u.outbox("process.kill", {"itemId": item.id, **on(item.member)}, thread.id)
    return stopped
