"""Shared vocabulary of the domain: statuses, trigger kinds, delivery states."""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    CANCELLED = "cancelled"


ACTIVE_RUN = frozenset({RunStatus.QUEUED, RunStatus.RUNNING})


class Trigger(StrEnum):
    USER = "user"
    TASK = "task"
    MESSAGE = "message"
    BACKGROUND_COMMAND = "background_command"
    MONITOR_EVENT = "monitor_event"
    MONITOR_FINISHED = "monitor_finished"
    SCHEDULED = "scheduled"
    DELEGATED_TASK = "delegated_task"
    TASK_DEADLINE = "task_deadline"
    RESTART = "restart"


class ItemKind(StrEnum):
    COMMAND = "command"
    MONITOR = "monitor"
    SCHEDULE = "schedule"
    TASK = "task"
    #: Background work an agent runs itself that is not a shell: a Claude Code subagent.
    AGENT = "agent"


class ItemStatus(StrEnum):
    RUNNING = "running"
    ENDED = "ended"
    FAILED = "failed"
    CANCELLED = "cancelled"


class TaskStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"


OPEN_TASK = frozenset({TaskStatus.QUEUED, TaskStatus.RUNNING})


class WorkState(StrEnum):
    WORKING = "working"
    WAITING_BACKGROUND = "waiting_background"
    RESULT_AVAILABLE = "result_available"


class OnDeadline(StrEnum):
    """What happens when a task is still open at its deadline (SPEC §11)."""

    WAKE = "wake"
    CANCEL = "cancel"


class Delivery(StrEnum):
    PENDING = "pending"
    CLAIMED = "claimed"
    DELIVERED = "delivered"
    ACKNOWLEDGED = "acknowledged"
    DISPOSED = "disposed"


class DomainError(Exception):
    """A rule of the domain was broken: an illegal transition or an impossible request."""
