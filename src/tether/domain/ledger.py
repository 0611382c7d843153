"""The delivery ledger (SPEC §10): for each task a thread delegated, how its answer reached
the thread — as the task's result, as a follow-up (with that follow-up's own wake), still
pending, or cancelled — and which wake run of the thread it woke.

Pure: task and run records in, JSON rows out. The JSON API (``ledger`` in a thread view)
and the web page show these very rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tether.domain.records import Run, Task
from tether.domain.types import Delivery, TaskStatus

RESULT = "result"
FOLLOW_UP = "follow-up"
PENDING = "pending"
CANCELLED = "cancelled"
CALL = "call"
DISPOSED = "disposed"


def reached_as(task: Task) -> str:
    """How the task's answer reached its parent (or that it has not yet)."""
    if task.status == TaskStatus.CANCELLED:
        return CANCELLED
    if task.is_open:
        return PENDING
    if task.delivered_as == CALL:
        return CALL
    if task.delivery_state == Delivery.DISPOSED:
        return DISPOSED
    if task.delivered_as in (RESULT, FOLLOW_UP):
        return task.delivered_as
    return PENDING  # terminal, its wake not yet claimed


def wake_state(delivery_state: str) -> str:
    """The wake's own progress, in a person's words."""
    return {
        Delivery.PENDING: "not yet queued",
        Delivery.CLAIMED: "queued",
        Delivery.DELIVERED: "running",
        Delivery.ACKNOWLEDGED: "handled",
        Delivery.DISPOSED: "none",
    }.get(Delivery(delivery_state), delivery_state)


def row(task: Task, runs_by_id: dict[str, Run]) -> dict[str, Any]:
    wake_run = runs_by_id.get(task.wake_run_id or "")
    wake = None
    if task.wake_run_id:
        wake = {
            "messageId": task.wake_message_id,
            "runId": task.wake_run_id,
            "runSeq": wake_run.seq if wake_run else None,
            "runStatus": wake_run.status if wake_run else None,
            "state": wake_state(task.delivery_state),
        }
    return {
        "taskId": task.id,
        "title": task.title,
        "followUpOf": task.follow_up_of,
        "childEnvironmentId": task.child_environment_id,
        "childThreadId": task.child_thread_id or None,
        "status": task.status,
        "resultText": (task.result or {}).get("text"),
        "reachedAs": reached_as(task),
        "delivery": task.delivery_state,
        "wake": wake,
        "createdAt": task.created_at,
        "completedAt": task.completed_at,
    }


def ledger(tasks: Iterable[Task], runs: Iterable[Run]) -> list[dict[str, Any]]:
    """One row per task (follow-ups right after the task they follow), oldest first."""
    runs_by_id = {run.id: run for run in runs}
    found = sorted(tasks, key=lambda t: (t.created_at, t.id))
    ids = {t.id for t in found}
    roots = [t for t in found if not t.follow_up_of or t.follow_up_of not in ids]
    root_ids = {t.id for t in roots}
    by_root: dict[str, list[Task]] = {}
    for task in found:
        if task.id not in root_ids:
            by_root.setdefault(task.follow_up_of or "", []).append(task)
    rows: list[dict[str, Any]] = []
    for root in roots:
        rows.append(row(root, runs_by_id))
        rows.extend(row(follow_up, runs_by_id) for follow_up in by_root.get(root.id, []))
    return rows
