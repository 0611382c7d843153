"""The deadline rules (SPEC §11): validation, the environment default, firing at most
once and only while the task is open, and what the notice says."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.domain import deadlines, tasks
from tether.domain.records import Item, Link, Run, Task
from tether.domain.types import DomainError, ItemKind, RunStatus, TaskStatus, WorkState

AT = "2026-12-03T08:00:00.000Z"


def make_task(**fields: object) -> Task:
    base = {
        "id": "tsk_1",
        "parent_environment_id": "env_a",
        "parent_thread_id": "thr_p",
        "child_environment_id": "env_a",
        "child_thread_id": "thr_c",
        "created_at": AT,
    }
    return Task(**{**base, **fields})  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- check


@pytest.mark.parametrize("value", [0, -1, 1.5, "1000", True, deadlines.MAX_DEADLINE_MS + 1])
def test_a_deadline_must_be_a_positive_whole_number_of_ms(value: object) -> None:
    with pytest.raises(DomainError, match="deadlineMs must be a whole number of milliseconds"):
        deadlines.check(value, None)


@pytest.mark.parametrize("mode", ["later", "", "WAKE", 1])
def test_on_deadline_is_wake_or_cancel(mode: object) -> None:
    with pytest.raises(DomainError, match="onDeadline must be 'wake' or 'cancel'"):
        deadlines.check(1000, mode)


@pytest.mark.parametrize("value", [None, 1, 60_000, deadlines.MAX_DEADLINE_MS])
@pytest.mark.parametrize("mode", [None, "wake", "cancel"])
def test_good_deadlines_pass(value: int | None, mode: str | None) -> None:
    deadlines.check(value, mode)


# ---------------------------------------------------------------------------- set


def test_the_deadline_counts_from_the_task_s_creation() -> None:
    task = make_task()
    deadlines.set_deadline(task, 1500, "cancel")
    assert (task.deadline_at, task.on_deadline) == ("2026-12-03T08:00:01.500Z", "cancel")


def test_without_a_deadline_the_default_applies_and_wake_is_the_mode() -> None:
    task = make_task()
    deadlines.set_deadline(task, None, None, default_ms=60_000)
    assert (task.deadline_at, task.on_deadline) == ("2026-12-03T08:01:00.000Z", "wake")


def test_an_own_deadline_beats_the_default() -> None:
    task = make_task()
    deadlines.set_deadline(task, 1000, None, default_ms=60_000)
    assert task.deadline_at == "2026-12-03T08:00:01.000Z"


def test_no_deadline_and_no_default_means_none() -> None:
    task = make_task()
    deadlines.set_deadline(task, None, None)
    assert task.deadline_at is None and not task.overdue


def test_a_bad_deadline_changes_nothing() -> None:
    task = make_task()
    before = task.to_dict()
    with pytest.raises(DomainError):
        deadlines.set_deadline(task, -5, "wake")
    assert task.to_dict() == before


# ---------------------------------------------------------------------------- passed


@pytest.mark.parametrize("mode", ["wake", "cancel"])
def test_an_open_task_s_deadline_fires_once(mode: str) -> None:
    task = make_task(status=TaskStatus.RUNNING)
    deadlines.set_deadline(task, 1000, mode)
    assert deadlines.passed(task) == mode
    assert task.overdue
    assert deadlines.passed(task) is None, "a deadline fires at most once"


def test_a_task_that_ended_first_never_fires() -> None:
    task = make_task(status=TaskStatus.RUNNING)
    deadlines.set_deadline(task, 1000, "wake")
    answer = Run("run_1", "thr_c", 1, {"kind": "task"}, AT, RunStatus.COMPLETED, reply="FINAL", started_at=AT)
    tasks.complete(task, answer, AT)
    assert deadlines.passed(task) is None
    assert not task.overdue


def test_a_task_without_a_deadline_never_fires() -> None:
    task = make_task(status=TaskStatus.RUNNING)
    assert deadlines.passed(task) is None and not task.overdue


@given(
    events=st.lists(st.sampled_from(["deadline", "answer", "cancel"]), min_size=1, max_size=6),
    mode=st.sampled_from(["wake", "cancel"]),
)
def test_whatever_the_order_the_deadline_fires_at_most_once_and_only_while_open(
    events: list[str], mode: str
) -> None:
    task = make_task(status=TaskStatus.RUNNING)
    deadlines.set_deadline(task, 1000, mode)
    fired, open_when_fired = 0, []
    for event in events:
        if event == "deadline":
            was_open = task.is_open
            if deadlines.passed(task) is not None:
                fired += 1
                open_when_fired.append(was_open)
        elif task.is_open and event == "answer":
            tasks.complete(task, None, AT)
        elif task.is_open:
            tasks.cancel(task, AT)
    assert fired <= 1
    assert all(open_when_fired)
    assert task.overdue == (fired == 1)


# ---------------------------------------------------------------------------- notice


def test_the_notice_names_the_task_and_how_it_stands() -> None:
    task = make_task(
        title="suite", status=TaskStatus.RUNNING, work_state=WorkState.WAITING_BACKGROUND, interim="WAITING"
    )
    deadlines.set_deadline(task, 1000, "wake")
    held = [Item("bg_1", "thr_c", ItemKind.COMMAND, AT, label="b1", command="make test", awaited=True)]
    text = deadlines.notice_text(task, held, None)
    assert text.splitlines()[:4] == [
        '[deadline of task tsk_1 "suite": still open at its deadline 2026-12-03T08:00:01.000Z]',
        "status: running; workState: waiting_background",
        "latest interim: WAITING",
        f"waits on: command b1 `make test` running since {AT}",
    ]
    assert "stays open" in text


def test_the_notice_of_a_remote_task_says_how_the_link_is() -> None:
    task = make_task(child_environment_id="env_b", status=TaskStatus.RUNNING)
    deadlines.set_deadline(task, 1000, "wake")
    link = Link("env_b", "laptop", "http://b", "t", AT, status="unreachable", last_error="ConnectError")
    text = deadlines.notice_text(task, [], link)
    assert "latest interim: (none yet)" in text
    assert "link to laptop: unreachable (ConnectError)" in text
    assert "waits on" not in text
