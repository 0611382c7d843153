"""The run state machine: ``queued → running → completed | failed | interrupted | cancelled``."""

from __future__ import annotations

from tether.domain.records import Run
from tether.domain.types import DomainError, RunStatus, Trigger

_ENDINGS = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.INTERRUPTED, RunStatus.CANCELLED})

#: Trigger kinds whose queued run takes in later triggers of the same kind and key.
#: Everything else gets a run of its own (SPEC §1: kinds never fold into each other).
#: ``monitor_finished`` folds only into the run its own unhandled lines became (same
#: monitor); ``restart`` folds so that a thread gets one restart run however much it lost.
FOLDING = frozenset(
    {Trigger.DELEGATED_TASK, Trigger.MONITOR_EVENT, Trigger.MONITOR_FINISHED, Trigger.RESTART}
)

#: How a posted message joins the thread's runs: ``auto`` starts a run now or queues it
#: behind the active one, ``queue`` always queues, ``now`` stops the running run and goes
#: ahead of every queued one.
MESSAGE_MODES = ("auto", "queue", "now")


def next_to_start(queued: list[Run]) -> Run:
    """The queued run a thread starts next: the oldest, except that a run queued ``first``
    (a ``now`` message) goes ahead of the others."""
    return min(queued, key=lambda run: (not run.trigger.get("first"), run.seq))


def start(run: Run, at: str) -> None:
    if run.status != RunStatus.QUEUED:
        raise DomainError(f"run {run.id} is {run.status}, only a queued run can start")
    run.status = RunStatus.RUNNING
    run.started_at = at


def finish(run: Run, status: str, at: str, reply: str | None = None, error: str | None = None) -> None:
    """End a run. A queued run may only be cancelled (it never began)."""
    if status not in _ENDINGS:
        raise DomainError(f"{status!r} is not a final run status")
    if run.status == RunStatus.QUEUED and status != RunStatus.CANCELLED:
        raise DomainError(f"run {run.id} never started; it can only be cancelled")
    if run.status not in (RunStatus.QUEUED, RunStatus.RUNNING):
        raise DomainError(f"run {run.id} already ended as {run.status}")
    run.status = status
    run.ended_at = at
    run.reply = reply
    run.error = error


def folds_into(queued: Run, kind: str, key: str | None) -> bool:
    """Whether a new trigger of ``kind`` (for ``key``, e.g. a monitor id) joins ``queued``."""
    if queued.status != RunStatus.QUEUED or queued.kind != kind or kind not in FOLDING:
        return False
    return queued.trigger.get("key") == key
