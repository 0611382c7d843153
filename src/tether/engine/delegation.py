"""Delegation: ``delegate_task`` (to this environment or a linked one), the destination
side of a remote delegation, wait-mode calls and deadlines (SPEC §1, §11).

A task, its held item in the parent and — here — its child thread are one transaction,
so a retry finds all of them or none (G9). A remote child is asked for by the link's
pusher from the task's durable ``remote_pending`` mark, until the peer answers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tether.domain import access as rules
from tether.domain import deadlines, tasks
from tether.domain.records import Item, Link, Task, Thread
from tether.domain.types import OPEN_TASK, Delivery, DomainError, OnDeadline, Trigger
from tether.domain.views import item_view, task_view
from tether.engine import access
from tether.engine.kernel import cancel, settle
from tether.engine.unit import Unit
from tether.engine.units import Units
from tether.engine.writes import message, new_thread, post, queue, save_task, task_item
from tether.errors import Conflict, Forbidden, Invalid, TetherError
from tether.ids import new_id
from tether.types import Caller


@dataclass(frozen=True)
class Handover:
    """A task a linked environment hands us (``POST /api/tasks``), under its own id."""

    task_id: str
    text: str
    origin: dict[str, Any]
    provider: str | None = None
    title: str | None = None
    hold: bool = True
    mode: str = "async"
    model: str | None = None


class Delegation:
    """The commands of delegated tasks, on both sides of a link."""

    def __init__(self, units: Units) -> None:
        self.units = units

    def delegate(
        self,
        caller: Caller,
        task: str,
        *,
        environment_id: str | None = None,
        provider: str | None = None,
        mode: str = "async",
        hold: bool = True,
        title: str | None = None,
        client_request_id: str | None = None,
        model: str | None = None,
        deadline_ms: int | None = None,
        on_deadline: str | None = None,
        label: str | None = None,
    ) -> dict[str, Any]:
        """``delegate_task``: a task and its held item in the parent; with a linked
        ``environment_id`` the peer creates the child later (``remote_pending``), else
        the child thread is created here in the same transaction."""
        if mode not in ("async", "wait"):
            raise Invalid(f"mode must be 'async' or 'wait', not {mode!r}")
        if not task.strip():
            raise Invalid("task must not be empty")
        _check_deadline(deadline_ms, on_deadline)
        _check_label(label)
        here = self.units.environment_id
        where = environment_id or here
        remote = where != here

        def body(u: Unit) -> dict[str, Any]:
            parent = access.acting_thread(u, caller)
            if remote and parent.token_id is not None:
                raise Forbidden("work started through a link cannot use this environment's links")
            record = Task(
                id=new_id("tsk"),
                parent_environment_id=here,
                parent_thread_id=parent.id,
                child_environment_id=where,
                child_thread_id="",
                created_at=u.at,
                title=title,
                label=label,
                mode=mode,
                hold=hold,
                waiting_call=mode == "wait",
            )
            deadlines.set_deadline(record, deadline_ms, on_deadline, self.units.default_deadline_ms)
            if remote:
                record.remote_pending = "create"
                record.remote_request = {"task": task, "provider": provider, "model": model}
                save_task(u, record, "task.created")
            else:
                chosen = provider or tasks.default_provider(task, parent.provider)
                self.open_child(u, record, task, chosen, parent.token_id, origin=None, model=model)
            task_item(u, record, hold)
            if remote:
                u.outbox("peer.push", {"environmentId": where})
            settle(u)  # a local child's first run has started: answer with that state
            return task_view(record)

        return self.units.once(caller, "delegate", client_request_id, body)

    def delegate_remote(
        self, caller: Caller, environment_id: str, task: str, **options: Any
    ) -> dict[str, Any]:
        """``delegate`` to the linked environment ``environment_id`` (the links' name)."""
        return self.delegate(caller, task, environment_id=environment_id, **options)

    def open_child(
        self,
        u: Unit,
        task: Task,
        text: str,
        provider: str,
        token_id: str | None,
        origin: dict[str, Any] | None,
        model: str | None = None,
    ) -> Thread:
        """The child thread of ``task`` here, with the task's text as its first message."""
        self.units.check_provider(provider)
        parent = {
            "environmentId": task.parent_environment_id,
            "threadId": task.parent_thread_id,
            "taskId": task.id,
        }
        child = new_thread(u, provider, task.title, token_id, parent, task.id, model)
        task.child_thread_id = child.id
        save_task(u, task, "task.created")
        source = {"kind": Trigger.TASK, "taskId": task.id, "origin": origin or parent}
        post(u, child, text, source, Trigger.TASK)
        return child

    def accept_task(self, caller: Caller, handover: Handover) -> dict[str, Any]:
        """Destination side of a remote delegation: the child thread, fenced to the link
        token, with the task under the origin's id. Idempotent on that id (G9)."""
        self._check_handover(caller, handover)
        return self.units.once(caller, "accept_task", handover.task_id, self._accepting(caller, handover))

    def accept_tasks(self, caller: Caller, handovers: list[Handover]) -> list[dict[str, Any] | TetherError]:
        """Several handovers (an origin pushing a batch), each as by ``accept_task`` and
        answered on its own: its task's view or why it was refused. All in one transaction,
        the usual case; if any is refused, each in its own, so that a refusal takes
        nothing from the others (and each answer is what ``accept_task`` would give)."""
        try:
            for handover in handovers:
                self._check_handover(caller, handover)
            calls = [(h.task_id, self._accepting(caller, h)) for h in handovers]
            return list(self.units.once_each(caller, "accept_task", calls))
        except TetherError:
            return [self._accept_or_refuse(caller, handover) for handover in handovers]

    def _accept_or_refuse(self, caller: Caller, handover: Handover) -> dict[str, Any] | TetherError:
        try:
            return self.accept_task(caller, handover)
        except TetherError as error:
            return error

    def _check_handover(self, caller: Caller, handover: Handover) -> None:
        if caller.kind != "link":
            raise Forbidden("only a link token can hand this environment a task")
        access.check_origin(handover.origin, self.units.environment_id)

    def _accepting(self, caller: Caller, handover: Handover) -> Callable[[Unit], dict[str, Any]]:
        origin = handover.origin

        def body(u: Unit) -> dict[str, Any]:
            existing = u.load(Task, handover.task_id)
            if existing is not None:
                child = u.load(Thread, existing.child_thread_id)
                if child is None or not access.visible(u, caller, child):
                    raise Forbidden(f"task id {handover.task_id!r} is not available to this token")
                raise Conflict(f"task {handover.task_id!r} already exists")
            record = Task(
                id=handover.task_id,
                parent_environment_id=origin["environmentId"],
                parent_thread_id=origin["threadId"],
                child_environment_id=self.units.environment_id,
                child_thread_id="",
                created_at=u.at,
                title=handover.title,
                mode=handover.mode,
                hold=handover.hold,
            )
            chosen = handover.provider or tasks.default_provider(handover.text, "script")
            self.open_child(u, record, handover.text, chosen, caller.token_id, origin, handover.model)
            return task_view(record)

        return body

    def end_wait(self, task_id: str) -> dict[str, Any] | None:
        """A wait-mode call stops waiting. Terminal: it takes the result (no wake, G3).
        Not yet: it returns ``timedOut`` and the completion wake comes later (G8)."""
        with self.units.unit() as u:
            task = u.need(Task, task_id, "task")
            if task.waiting_call and task.status not in OPEN_TASK:
                task.waiting_call = False
                tasks.advance_delivery(task, Delivery.DELIVERED)
                tasks.advance_delivery(task, Delivery.ACKNOWLEDGED)
                save_task(u, task, "task.delivery")
                return task_view(task)
            task.waiting_call = False
            u.save(task)
            return None

    def deadline_due(self, item_id: str) -> None:
        """A task's deadline came due (the timer says when; also one that fell due while we
        were down): the parent is told once, or the task is cancelled (SPEC §11). The
        ``overdue`` mark and the notice (or the cancel and its wake) are one transaction,
        so a deadline fires at most once; an answer that came first leaves nothing to do."""
        with self.units.unit() as u:
            item = u.load(Item, item_id)
            task = u.load(Task, item.task_id) if item is not None else None
            if item is None or task is None or not item.is_running or item.due_at is None:
                return
            item.due_at = None  # disarmed: nothing more is due for this item
            u.save(item)
            u.emit("item.updated", item_view(item), thread_id=item.thread_id)
            action = deadlines.passed(task)
            if action is None:
                return
            save_task(u, task)
            if action == OnDeadline.CANCEL:
                cancel(u, task, by_parent=False, reason="deadline")
            else:
                _deadline_notice(u, task)


def _deadline_notice(u: Unit, task: Task) -> None:
    """One ``task_deadline`` notification and run in the parent: which task, and how it
    stands — what its child still holds on (local), or the link's state (remote)."""
    parent = u.load(Thread, task.parent_thread_id)
    if parent is None:
        return
    local = rules.local_side(task, task.child_thread_id, u.environment_id)
    held = u.query(Item, thread_id=task.child_thread_id, held=True) if local else []
    link = None if local else u.load(Link, task.child_environment_id)
    source = {
        "kind": Trigger.TASK_DEADLINE,
        "taskId": task.id,
        "title": task.title,
        "status": task.status,
        "workState": task.work_state,
    }
    notice = message(u, parent, "notification", deadlines.notice_text(task, held, link), source)
    queue(u, parent, Trigger.TASK_DEADLINE, [notice], key=task.id, taskId=task.id)


#: A label is a short name, not a document: it is a column the parent's lookups use.
MAX_LABEL = 200


def _check_label(label: str | None) -> None:
    if label is not None and not (0 < len(label.strip()) == len(label) <= MAX_LABEL):
        raise Invalid(f"label must be 1 to {MAX_LABEL} characters with no space at either end")


def _check_deadline(deadline_ms: int | None, on_deadline: str | None) -> None:
    try:
        deadlines.check(deadline_ms, on_deadline)
    except DomainError as error:
        raise Invalid(str(error)) from None
