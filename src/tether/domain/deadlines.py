"""Deadlines: nothing waits forever (SPEC §11).

A delegated task may carry a deadline. When it passes while the task is still open, the
parent is told once (``wake``) or the task is cancelled (``cancel``). The rules here are
pure: the commands arm, fire and apply them in one transaction, and the timer only says
*when*.
"""

from __future__ import annotations

from datetime import timedelta

from tether.domain.records import Item, Link, Task
from tether.domain.types import DomainError, ItemKind, OnDeadline
from tether.ids import format_time, parse_time

#: The longest deadline accepted: a year. Longer is "never", and overflows a timestamp.
MAX_DEADLINE_MS = 365 * 24 * 3600 * 1000


def check(deadline_ms: object, on_deadline: object) -> None:
    """Refuse a deadline that is not a positive whole number of ms, or an unknown mode."""
    if deadline_ms is not None and (
        isinstance(deadline_ms, bool)
        or not isinstance(deadline_ms, int)
        or not 1 <= deadline_ms <= MAX_DEADLINE_MS
    ):
        raise DomainError(
            f"deadlineMs must be a whole number of milliseconds from 1 to {MAX_DEADLINE_MS}, "
            f"not {deadline_ms!r}"
        )
    if on_deadline is not None and on_deadline not in set(OnDeadline):
        raise DomainError(f"onDeadline must be 'wake' or 'cancel', not {on_deadline!r}")


def set_deadline(
    task: Task, deadline_ms: int | None, on_deadline: str | None, default_ms: int | None = None
) -> None:
    """Give a new task its deadline: its own, else the environment's default (or none)."""
    check(deadline_ms, on_deadline)
    chosen = deadline_ms if deadline_ms is not None else default_ms
    task.on_deadline = str(on_deadline or OnDeadline.WAKE)
    if chosen is not None:
        task.deadline_at = format_time(parse_time(task.created_at) + timedelta(milliseconds=chosen))


def passed(task: Task) -> str | None:
    """The deadline has passed: what to do now (``wake`` or ``cancel``), or None.

    None when the task has no deadline, has already ended (an answer before the deadline
    never fires it), or its deadline already fired: it fires at most once, whatever
    retries or restarts do. The task is marked ``overdue``.
    """
    if task.deadline_at is None or task.overdue or not task.is_open:
        return None
    task.overdue = True
    return task.on_deadline


def notice_text(task: Task, held: list[Item], link: Link | None) -> str:
    """The ``task_deadline`` notification: which task, and how it stands (SPEC §11)."""
    title = f' "{task.title}"' if task.title else ""
    lines = [
        f"[deadline of task {task.id}{title}: still open at its deadline {task.deadline_at}]",
        f"status: {task.status}; workState: {task.work_state}",
        f"latest interim: {task.interim if task.interim is not None else '(none yet)'}",
    ]
    if held:
        lines.append("waits on: " + "; ".join(_held_text(item) for item in held))
    if link is not None:
        error = f" ({link.last_error})" if link.last_error else ""
        lines.append(f"link to {link.label or link.name}: {link.status}{error}")
    lines.append("The task stays open: its result still reaches you when the child settles.")
    return "\n".join(lines)


def _held_text(item: Item) -> str:
    name = f" {item.label}" if item.label else ""
    match item.kind:
        case ItemKind.COMMAND | ItemKind.MONITOR:
            return f"{item.kind}{name} `{item.command}` running since {item.started_at}"
        case ItemKind.SCHEDULE:
            return f"scheduled wake due at {item.due_at}"
        case ItemKind.TASK:
            return f"its own task {item.task_id}{name}"
    return f"{item.kind} {item.id}"
