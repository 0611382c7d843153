"""The run state machine (``tether.domain.runs``): every legal and illegal transition."""

from __future__ import annotations

import itertools

import pytest

from tether.domain import runs
from tether.domain.records import Run
from tether.domain.types import DomainError, RunStatus, Trigger

AT = "2026-01-01T00:00:00.000Z"
LATER = "2026-01-01T00:00:01.000Z"
ENDINGS = [RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.INTERRUPTED, RunStatus.CANCELLED]
#: Completion wakes fold (G3); monitor lines fold while a run is active; a monitor's end folds
#: into the run its unhandled lines became; a thread gets one restart run however much it lost.
FOLDING_KINDS = {Trigger.DELEGATED_TASK, Trigger.MONITOR_EVENT, Trigger.MONITOR_FINISHED, Trigger.RESTART}


def make_run(status: str = RunStatus.QUEUED, kind: str = Trigger.USER, key: str | None = None) -> Run:
    return Run(
        id="run_1",
        thread_id="thr_1",
        seq=1,
        trigger={"kind": str(kind), "key": key, "messageIds": []},
        queued_at=AT,
        status=status,
    )


# ---------------------------------------------------------------------------- start


def test_start_moves_a_queued_run_to_running_and_stamps_it() -> None:
    run = make_run()
    runs.start(run, LATER)
    assert run.status == RunStatus.RUNNING
    assert run.started_at == LATER
    assert run.ended_at is None
    assert run.is_active


@pytest.mark.parametrize("status", [s for s in RunStatus if s != RunStatus.QUEUED])
def test_only_a_queued_run_can_start(status: RunStatus) -> None:
    run = make_run(status)
    before = run.to_dict()
    with pytest.raises(DomainError):
        runs.start(run, LATER)
    assert run.to_dict() == before


# ---------------------------------------------------------------------------- finish


@pytest.mark.parametrize("ending", ENDINGS)
def test_a_running_run_may_end_in_every_final_status(ending: RunStatus) -> None:
    run = make_run()
    runs.start(run, AT)
    runs.finish(run, ending, LATER, reply="the reply", error="the error")
    assert run.status == ending
    assert run.ended_at == LATER
    assert run.reply == "the reply"
    assert run.error == "the error"
    assert run.started_at == AT
    assert not run.is_active


def test_finish_defaults_reply_and_error_to_none() -> None:
    run = make_run(RunStatus.RUNNING)
    runs.finish(run, RunStatus.COMPLETED, LATER)
    assert (run.reply, run.error) == (None, None)


def test_a_queued_run_can_only_be_cancelled() -> None:
    run = make_run()
    runs.finish(run, RunStatus.CANCELLED, LATER, error="stopped")
    assert run.status == RunStatus.CANCELLED
    assert run.started_at is None
    assert run.ended_at == LATER


@pytest.mark.parametrize("ending", [RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.INTERRUPTED])
def test_a_queued_run_cannot_complete_fail_or_be_interrupted(ending: RunStatus) -> None:
    run = make_run()
    with pytest.raises(DomainError):
        runs.finish(run, ending, LATER, reply="x")
    assert run.status == RunStatus.QUEUED
    assert run.reply is None and run.ended_at is None


@pytest.mark.parametrize(("ended", "again"), list(itertools.product(ENDINGS, ENDINGS)))
def test_an_ended_run_never_ends_again(ended: RunStatus, again: RunStatus) -> None:
    run = make_run(RunStatus.RUNNING)
    runs.finish(run, ended, AT, reply="first")
    with pytest.raises(DomainError):
        runs.finish(run, again, LATER, reply="second")
    assert (run.status, run.reply, run.ended_at) == (ended, "first", AT)


@pytest.mark.parametrize("from_status", [RunStatus.QUEUED, RunStatus.RUNNING])
@pytest.mark.parametrize("bad", [RunStatus.QUEUED, RunStatus.RUNNING, "done", ""])
def test_finish_rejects_a_status_that_is_not_final(from_status: RunStatus, bad: str) -> None:
    run = make_run(from_status)
    with pytest.raises(DomainError):
        runs.finish(run, bad, LATER)
    assert run.status == from_status


@pytest.mark.parametrize("status", list(RunStatus))
def test_is_active_means_queued_or_running(status: RunStatus) -> None:
    assert make_run(status).is_active == (status in (RunStatus.QUEUED, RunStatus.RUNNING))


@pytest.mark.parametrize("kind", list(Trigger))
def test_only_monitor_event_runs_are_progress(kind: Trigger) -> None:
    assert make_run(kind=kind).is_progress == (kind == Trigger.MONITOR_EVENT)


# ---------------------------------------------------------------------------- folding


@pytest.mark.parametrize("kind", list(Trigger))
@pytest.mark.parametrize("status", list(RunStatus))
def test_folds_into_only_a_queued_run_of_a_folding_kind_and_the_same_key(
    kind: Trigger, status: RunStatus
) -> None:
    queued = make_run(status, kind=kind, key="k1")
    expected = status == RunStatus.QUEUED and kind in FOLDING_KINDS
    assert runs.folds_into(queued, kind, "k1") is expected
    # a different key never folds
    assert runs.folds_into(queued, kind, "k2") is False
    assert runs.folds_into(queued, kind, None) is False


@pytest.mark.parametrize(("queued_kind", "new_kind"), [
    (a, b) for a, b in itertools.product(list(Trigger), list(Trigger)) if a != b
])
def test_different_trigger_kinds_never_fold(queued_kind: Trigger, new_kind: Trigger) -> None:
    queued = make_run(kind=queued_kind, key=None)
    assert runs.folds_into(queued, new_kind, None) is False


def test_completion_wakes_fold_with_no_key() -> None:
    wake = make_run(kind=Trigger.DELEGATED_TASK, key=None)
    assert runs.folds_into(wake, Trigger.DELEGATED_TASK, None) is True


def test_monitor_lines_fold_only_into_the_same_monitor() -> None:
    lines = make_run(kind=Trigger.MONITOR_EVENT, key="bg_a")
    assert runs.folds_into(lines, Trigger.MONITOR_EVENT, "bg_a") is True
    assert runs.folds_into(lines, Trigger.MONITOR_EVENT, "bg_b") is False


def test_folding_set() -> None:
    assert runs.FOLDING == FOLDING_KINDS


@pytest.mark.parametrize("kind", [k for k in Trigger if k not in FOLDING_KINDS])
def test_user_messages_commands_schedules_and_tasks_never_fold(kind: Trigger) -> None:
    queued = make_run(kind=kind, key=None)
    assert runs.folds_into(queued, kind, None) is False
    keyed = make_run(kind=kind, key="bg_a")
    assert runs.folds_into(keyed, kind, "bg_a") is False


def test_restart_runs_fold_into_one() -> None:
    restart = make_run(kind=Trigger.RESTART, key=None)
    assert runs.folds_into(restart, Trigger.RESTART, None) is True
    runs.start(restart, LATER)
    assert runs.folds_into(restart, Trigger.RESTART, None) is False


def test_a_monitor_end_folds_only_into_its_own_monitors_run() -> None:
    finished = make_run(kind=Trigger.MONITOR_FINISHED, key="bg_a")
    assert runs.folds_into(finished, Trigger.MONITOR_FINISHED, "bg_a") is True
    assert runs.folds_into(finished, Trigger.MONITOR_FINISHED, "bg_b") is False
    assert runs.folds_into(finished, Trigger.MONITOR_EVENT, "bg_a") is False


def test_started_run_no_longer_takes_folds() -> None:
    wake = make_run(kind=Trigger.DELEGATED_TASK)
    assert runs.folds_into(wake, Trigger.DELEGATED_TASK, None)
    runs.start(wake, LATER)
    assert not runs.folds_into(wake, Trigger.DELEGATED_TASK, None)
