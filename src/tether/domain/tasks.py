"""Delegated tasks: status, work state, results, follow-ups and delivery (SPEC §1, G1-G4)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from tether.domain.records import Run, Task
from tether.domain.types import Delivery, DomainError, ItemStatus, RunStatus, TaskStatus, WorkState

_RESULT_STATUS = {
    RunStatus.COMPLETED: TaskStatus.COMPLETED,
    RunStatus.FAILED: TaskStatus.FAILED,
    RunStatus.INTERRUPTED: TaskStatus.INTERRUPTED,
    RunStatus.CANCELLED: TaskStatus.CANCELLED,
}

#: The status a terminal task's item in its parent ends with.
_ITEM_END = {
    TaskStatus.COMPLETED: ItemStatus.ENDED,
    TaskStatus.FAILED: ItemStatus.FAILED,
    TaskStatus.INTERRUPTED: ItemStatus.FAILED,
    TaskStatus.CANCELLED: ItemStatus.CANCELLED,
}


def item_end(task: Task) -> ItemStatus:
    """How the parent's item of a task that has just ended ends (its status)."""
    return _ITEM_END[TaskStatus(task.status)]


def default_provider(text: str, fallback: str) -> str:
    """A child's provider when the delegation names none: a script object (JSON with
    ``tether_script``) runs on the script provider, anything else on ``fallback``."""
    try:
        parsed = json.loads(text)
    except ValueError:
        return fallback
    return "script" if isinstance(parsed, dict) and "tether_script" in parsed else fallback


def mark_running(task: Task) -> None:
    if task.status == TaskStatus.QUEUED:
        task.status = TaskStatus.RUNNING


def note_reply(task: Task, run: Run) -> None:
    """A non-progress run ended while the task is open: its reply is the interim."""
    if task.is_open and run.reply is not None:
        task.interim = run.reply


def note_progress(task: Task, run: Run) -> None:
    if run.reply is not None:
        task.progress.append({"runId": run.id, "text": run.reply, "at": run.ended_at})


def complete(task: Task, answer: Run | None, at: str, interrupted: bool = False) -> None:
    """The child settled: its last non-progress run's reply is the result (G1). A child
    stopped by ``thread_interrupt`` ends ``interrupted`` with that reply."""
    if not task.is_open:
        raise DomainError(f"task {task.id} is already {task.status}")
    if answer is not None and answer.is_progress:
        raise DomainError("a progress run is never a result (G4)")
    status = _RESULT_STATUS.get(answer.status, TaskStatus.COMPLETED) if answer else TaskStatus.COMPLETED
    if interrupted:
        status = TaskStatus.INTERRUPTED
    task.status = status
    task.work_state = WorkState.RESULT_AVAILABLE
    task.result = {
        "text": answer.reply if answer else None,
        "runId": answer.id if answer else None,
        "status": str(status),
    }
    task.completed_at = at


def cancel(task: Task, at: str) -> None:
    if not task.is_open:
        raise DomainError(f"task {task.id} is already {task.status}")
    task.status = TaskStatus.CANCELLED
    task.work_state = WorkState.RESULT_AVAILABLE
    task.result = {"text": None, "runId": None, "status": "cancelled"}
    task.completed_at = at


def fail(task: Task, at: str, error: str) -> None:
    """The task could not run at all (a peer refused to create its child)."""
    if not task.is_open:
        raise DomainError(f"task {task.id} is already {task.status}")
    task.status = TaskStatus.FAILED
    task.work_state = WorkState.RESULT_AVAILABLE
    task.result = {"text": None, "runId": None, "status": "failed", "error": error}
    task.completed_at = at


#: What a remote child's environment decides about its task, copied into our record.
#: Delivery is ours (the origin wakes its parent), so it is never copied.
_MIRRORED = {
    "childThreadId": "child_thread_id",
    "status": "status",
    "workState": "work_state",
    "interim": "interim",
    "result": "result",
    "progress": "progress",
    "completedAt": "completed_at",
    "childActive": "child_active",
}


def mirror(task: Task, view: dict[str, Any]) -> None:
    """Take a remote child's view of this task (G5: the peer decides, we deliver)."""
    for field_name, attribute in _MIRRORED.items():
        if view.get(field_name) is not None:
            setattr(task, attribute, view[field_name])
    for follow_up_id in view.get("followUps") or []:
        if follow_up_id not in task.follow_ups:
            task.follow_ups.append(follow_up_id)


def mirror_progress(task: Task, view: dict[str, Any]) -> bool:
    """Progress a remote child reported after this task ended; True if any was new."""
    known = {entry.get("runId") for entry in task.progress}
    new = [entry for entry in view.get("progress") or [] if entry.get("runId") not in known]
    task.progress.extend(new)
    return bool(new)


def mirror_child_active(task: Task, view: dict[str, Any]) -> bool:
    """Whether a remote child still has work that will wake it; True if that changed."""
    active = view.get("childActive")
    if active is None or bool(active) == task.child_active:
        return False
    task.child_active = bool(active)
    return True


def follow_up(original: Task, task_id: str, at: str) -> Task:
    """A new task for a later answer of the same child (same parent and child threads)."""
    return Task(
        id=task_id,
        parent_environment_id=original.parent_environment_id,
        parent_thread_id=original.parent_thread_id,
        child_environment_id=original.child_environment_id,
        child_thread_id=original.child_thread_id,
        created_at=at,
        title=original.title,
        mode="async",
        hold=original.hold,
        follow_up_of=original.id,
    )


# Delivery: pending → claimed → delivered → acknowledged, or disposed.

_DELIVERY_STEPS = {
    Delivery.CLAIMED: {Delivery.PENDING},
    Delivery.DELIVERED: {Delivery.PENDING, Delivery.CLAIMED},
    Delivery.ACKNOWLEDGED: {Delivery.DELIVERED},
    Delivery.DISPOSED: {Delivery.PENDING, Delivery.CLAIMED},
}


def advance_delivery(task: Task, to: Delivery) -> bool:
    """Move the delivery on; False (and no change) when it is already at or past ``to``.

    Returning False instead of raising is what makes duplicate deliveries harmless (G3):
    the second attempt finds the state already moved and does nothing.
    """
    if task.delivery_state not in _DELIVERY_STEPS.get(to, ()):
        return False
    task.delivery_state = to
    return True


def release_claim(task: Task) -> bool:
    """A wait-mode call claimed the result but ended without handing it over (it timed
    out or its connection dropped): the result goes back to ``pending`` so that the
    parent is woken with it instead. The one step back the delivery takes, and only from
    a call's claim — any later state stays (G3); False (no change) otherwise."""
    if task.delivered_as != "call" or task.delivery_state != Delivery.CLAIMED:
        return False
    task.delivery_state = Delivery.PENDING
    task.delivered_as = None
    return True


def wake_text(tasks: Iterable[Task]) -> str:
    """A completion wake lists each task once with its result text verbatim, nothing else."""
    parts = []
    for task in tasks:
        title = f' "{task.title}"' if task.title else ""
        kind = f"follow-up of {task.follow_up_of}" if task.follow_up_of else "task"
        text = (task.result or {}).get("text")
        body = text if text is not None else "(no reply)"
        parts.append(f"[{kind} {task.id}{title}: {task.status}]\n{body}")
    return "\n\n".join(parts)
