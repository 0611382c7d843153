"""The delivery ledger (SPEC §10) from task and run records."""

from __future__ import annotations

from typing import Any

from tether.domain.ledger import ledger, reached_as
from tether.domain.records import Run, Task

AT = "2026-01-01T00:00:00.000Z"


def task(task_id: str, at: str = AT, **fields: Any) -> Task:
    return Task(task_id, "env", "thr_p", "env", "thr_c", at, title="probe 1", **fields)


def test_probe_1_result_then_follow_up_each_with_its_wake() -> None:
    root = task(
        "tsk_a",
        status="completed",
        result={"text": "WAITING", "runId": "r", "status": "completed"},
        delivered_as="result",
        delivery_state="acknowledged",
        wake_message_id="msg_1",
        wake_run_id="run_2",
        follow_ups=["tsk_b"],
    )
    follow_up = task(
        "tsk_b",
        "2026-01-01T00:00:03.000Z",
        status="completed",
        follow_up_of="tsk_a",
        result={"text": "FINAL", "runId": "r2", "status": "completed"},
        delivered_as="follow-up",
        delivery_state="claimed",
        wake_message_id="msg_2",
        wake_run_id="run_3",
    )
    runs = [
        Run("run_2", "thr_p", 2, {"kind": "delegated_task"}, AT, status="completed"),
        Run("run_3", "thr_p", 3, {"kind": "delegated_task"}, AT, status="queued"),
    ]
    rows = ledger([follow_up, root], runs)  # any order in: root first, its follow-up after it
    assert [r["taskId"] for r in rows] == ["tsk_a", "tsk_b"]
    assert rows[0]["reachedAs"] == "result" and rows[0]["resultText"] == "WAITING"
    assert rows[0]["wake"] == {
        "messageId": "msg_1",
        "runId": "run_2",
        "runSeq": 2,
        "runStatus": "completed",
        "state": "handled",
    }
    assert rows[1]["reachedAs"] == "follow-up" and rows[1]["resultText"] == "FINAL"
    assert rows[1]["followUpOf"] == "tsk_a"
    assert rows[1]["wake"]["runSeq"] == 3 and rows[1]["wake"]["state"] == "queued"


def test_pending_cancelled_call_disposed() -> None:
    assert reached_as(task("t", status="running")) == "pending"
    assert reached_as(task("t", status="completed")) == "pending"  # ended, wake not yet claimed
    assert reached_as(task("t", status="cancelled", delivered_as="result")) == "cancelled"
    assert reached_as(task("t", status="completed", delivered_as="call")) == "call"
    assert reached_as(task("t", status="failed", delivery_state="disposed")) == "disposed"
    assert reached_as(task("t", status="interrupted", delivered_as="result")) == "result"
    row = ledger([task("t", status="running")], [])[0]
    assert row["wake"] is None and row["reachedAs"] == "pending" and row["resultText"] is None


def test_a_wake_run_not_among_the_runs_is_still_named() -> None:
    row = ledger([task("t", status="completed", delivered_as="result", wake_run_id="run_x")], [])[0]
    assert row["wake"]["runId"] == "run_x" and row["wake"]["runSeq"] is None
