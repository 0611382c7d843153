"""``threads.is_settled`` / ``work_state`` / ``status``: the one definition of "settled" (SPEC §1)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.domain import threads
from tether.domain.records import Item, Run
from tether.domain.types import ItemKind, ItemStatus, RunStatus, Trigger, WorkState

AT = "2026-01-01T00:00:00.000Z"
_ids = itertools.count()


def run(kind: str = Trigger.USER, status: str = RunStatus.RUNNING) -> Run:
    n = next(_ids)
    return Run(f"run_{n}", "thr_1", n, {"kind": str(kind), "key": None, "messageIds": []}, AT, status=status)


def item(kind: str = ItemKind.COMMAND, status: str = ItemStatus.RUNNING, **flags: bool) -> Item:
    return Item(f"bg_{next(_ids)}", "thr_1", kind, AT, status=status, **flags)  # type: ignore[arg-type]


NON_PROGRESS = [k for k in Trigger if k != Trigger.MONITOR_EVENT]


def test_nothing_at_all_is_settled_idle_and_result_available() -> None:
    assert threads.is_settled([], []) is True
    assert threads.work_state([], []) == WorkState.RESULT_AVAILABLE
    assert threads.status([]) == "idle"


@pytest.mark.parametrize("kind", NON_PROGRESS)
@pytest.mark.parametrize("status", [RunStatus.QUEUED, RunStatus.RUNNING])
def test_an_active_non_progress_run_unsettles(kind: Trigger, status: RunStatus) -> None:
    active = [run(kind, status)]
    assert threads.is_settled(active, []) is False
    assert threads.work_state(active, []) == WorkState.WORKING
    assert threads.status(active) == "running"


@pytest.mark.parametrize("status", [RunStatus.QUEUED, RunStatus.RUNNING])
def test_progress_runs_do_not_unsettle_but_do_make_the_thread_running(status: RunStatus) -> None:
    active = [run(Trigger.MONITOR_EVENT, status)]
    assert threads.is_settled(active, []) is True
    assert threads.work_state(active, []) == WorkState.RESULT_AVAILABLE
    assert threads.status(active) == "running"


ENDED_RUN = [RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.INTERRUPTED, RunStatus.CANCELLED]


@pytest.mark.parametrize("kind", list(Trigger))
@pytest.mark.parametrize("status", ENDED_RUN)
def test_ended_runs_are_ignored_even_if_passed_in(kind: Trigger, status: RunStatus) -> None:
    ended = [run(kind, status)]
    assert threads.is_settled(ended, []) is True
    assert threads.work_state(ended, []) == WorkState.RESULT_AVAILABLE
    assert threads.status(ended) == "idle"


@pytest.mark.parametrize(
    "held",
    [
        {"kind": ItemKind.COMMAND, "awaited": True},
        {"kind": ItemKind.MONITOR, "persistent": False},
        {"kind": ItemKind.SCHEDULE, "hold": True},
        {"kind": ItemKind.TASK, "hold": True},
    ],
)
def test_held_items_unsettle_and_mean_waiting_background(held: dict) -> None:
    items = [item(**held)]
    assert threads.is_settled([], items) is False
    assert threads.work_state([], items) == WorkState.WAITING_BACKGROUND
    assert threads.status([]) == "idle"
    # with a progress run alongside it is still waiting on the held item
    assert threads.work_state([run(Trigger.MONITOR_EVENT)], items) == WorkState.WAITING_BACKGROUND


@pytest.mark.parametrize(
    "free",
    [
        {"kind": ItemKind.COMMAND, "awaited": False},
        {"kind": ItemKind.MONITOR, "persistent": True},
        {"kind": ItemKind.SCHEDULE, "hold": False},
        {"kind": ItemKind.TASK, "hold": False},
    ],
)
def test_items_that_are_not_held_do_not_unsettle(free: dict) -> None:
    assert threads.is_settled([], [item(**free)]) is True
    assert threads.work_state([], [item(**free)]) == WorkState.RESULT_AVAILABLE


@pytest.mark.parametrize("status", [ItemStatus.ENDED, ItemStatus.FAILED, ItemStatus.CANCELLED])
def test_ended_held_items_do_not_unsettle(status: ItemStatus) -> None:
    items = [item(ItemKind.COMMAND, status, awaited=True), item(ItemKind.MONITOR, status)]
    assert threads.is_settled([], items) is True


def test_working_beats_waiting_background() -> None:
    assert threads.work_state([run()], [item(awaited=True)]) == WorkState.WORKING


def test_accepts_generators() -> None:
    assert threads.is_settled((r for r in [run(Trigger.MONITOR_EVENT)]), (i for i in [])) is True
    assert threads.work_state((r for r in [run()]), (i for i in [])) == WorkState.WORKING


run_strategy = st.builds(
    run, st.sampled_from(list(Trigger)), st.sampled_from(list(RunStatus))
)
item_strategy = st.builds(
    item,
    st.sampled_from(list(ItemKind)),
    st.sampled_from(list(ItemStatus)),
    awaited=st.booleans(),
    persistent=st.booleans(),
    hold=st.booleans(),
)


@given(st.lists(run_strategy, max_size=6), st.lists(item_strategy, max_size=6))
def test_settled_iff_work_state_is_result_available(runs: list[Run], items: list[Item]) -> None:
    settled = threads.is_settled(runs, items)
    state = threads.work_state(runs, items)
    assert settled == (state == WorkState.RESULT_AVAILABLE)
    blocking_run = any(r.is_active and not r.is_progress for r in runs)
    assert settled == (not blocking_run and not any(i.held for i in items))
    # removing progress runs never changes whether a thread is settled (G4)
    assert threads.is_settled([r for r in runs if not r.is_progress], items) == settled
    assert threads.status(runs) == ("running" if any(r.is_active for r in runs) else "idle")
