"""``attention`` (SPEC §10): what a thread needs from a person, from its records alone."""

from __future__ import annotations

from typing import Any

import pytest

from tether.domain.attention import attention, last_answer_run, since, summary, will_answer
from tether.domain.records import Item, Run, Task, Thread

AT = "2026-01-01T00:00:00.000Z"
LATER = "2026-01-01T00:00:05.000Z"


def thread(**fields: Any) -> Thread:
    return Thread(id="thr_1", provider="script", created_at=AT, **fields)


def run(seq: int, status: str, kind: str = "user", **fields: Any) -> Run:
    return Run(f"run_{seq}", "thr_1", seq, {"kind": kind}, AT, status=status, **fields)


def item(kind: str = "command", status: str = "running", **fields: Any) -> Item:
    return Item(f"bg_{kind}", "thr_1", kind, AT, status=status, **fields)


def task(status: str = "running", child_active: bool = False) -> Task:
    return Task("tsk_1", "env", "thr_1", "env", "thr_2", AT, status=status, child_active=child_active)


CHILD = {"parent": {"environmentId": "env", "threadId": "thr_0", "taskId": "tsk_0"}}


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ({"active": [run(1, "running")]}, "working"),
        ({"active": [run(1, "queued")], "last": run(0, "completed")}, "working"),
        (
            {"active": [run(2, "running", "monitor_event")], "items": [item("monitor", persistent=True)]},
            "working",
        ),
        ({"items": [item(awaited=True)], "last": run(1, "completed")}, "waiting"),
        # not held, but its end still wakes the thread: never shown settled
        ({"items": [item()], "last": run(1, "completed")}, "waiting"),
        ({"items": [item("monitor", persistent=True)], "last": run(1, "completed")}, "waiting"),
        ({"items": [item("schedule", hold=False)], "last": run(1, "completed")}, "waiting"),
        ({"tasks": [task("running")], "last": run(1, "completed")}, "waiting"),
        # the task ended, but its child still works: the answer comes as a follow-up
        ({"tasks": [task("completed", child_active=True)], "last": run(2, "completed")}, "waiting"),
        ({"tasks": [task("completed")], "last": run(2, "completed")}, "settled"),
        ({"items": [item(status="ended")], "last": run(2, "completed")}, "settled"),
        ({"last": run(1, "failed")}, "failed"),
        ({"last": run(1, "interrupted")}, "needs_input"),
        ({"last": run(1, "cancelled")}, "needs_input"),
        ({}, "needs_input"),  # a thread a person made that never ran
        ({"thread": thread(**CHILD), "last": run(1, "interrupted")}, "settled"),
        ({"thread": thread(**CHILD), "last": run(1, "failed")}, "failed"),
        ({"thread": thread(cancelled=True, **CHILD), "last": run(1, "cancelled")}, "settled"),
        ({"thread": thread(**CHILD)}, "settled"),
    ],
)
def test_attention(case: dict[str, Any], expected: str) -> None:
    found = attention(
        case.get("thread", thread()),
        case.get("active", []),
        case.get("items", []),
        case.get("tasks", []),
        case.get("last"),
    )
    assert found == expected


def test_ended_items_and_ended_runs_are_ignored() -> None:
    state = attention(
        thread(), [run(1, "completed")], [item(status="cancelled")], [task("cancelled")], run(1, "completed")
    )
    assert state == "settled"


def test_will_answer() -> None:
    assert will_answer(task("queued")) and will_answer(task("completed", child_active=True))
    assert not will_answer(task("completed")) and not will_answer(task("cancelled"))


def test_last_answer_run_skips_progress_runs() -> None:
    runs = [run(1, "completed"), run(2, "completed", "monitor_event"), run(3, "running", "monitor_event")]
    assert last_answer_run(runs) is runs[0]
    assert last_answer_run([]) is None


def test_since_is_the_active_run_start_or_the_last_end() -> None:
    busy = run(2, "running", started_at=LATER)
    assert since("working", thread(), [busy], [], run(1, "completed", ended_at=AT)) == LATER
    queued = run(2, "queued")
    assert since("working", thread(), [queued], [], None) == AT
    assert since("waiting", thread(), [], [item()], run(1, "completed", ended_at=LATER)) == LATER
    assert since("waiting", thread(), [], [item()], None) == AT


def test_summary_from_all_records() -> None:
    runs = [run(1, "completed", ended_at=LATER)]
    assert summary(thread(), runs, [item(status="ended")], [task("completed")]) == {
        "attention": "settled",
        "attentionSince": LATER,
    }
    assert summary(thread(), runs, [], [task("completed", child_active=True)])["attention"] == "waiting"
