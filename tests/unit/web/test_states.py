"""Honest states on the page (issue 14): a run cut off by a restart or stopped on purpose is
neither a failure nor a success; a failed thread says why; a task's answers are listed as
its parent received them; deadlines and schedules count down."""

from __future__ import annotations

from typing import Any

from tether.web import model

CTX = model.Context("env_here", "here")


def _run(status: str, error: str | None = None, trigger: str = "user") -> dict[str, Any]:
    return {"runId": "run_1", "status": status, "error": error, "trigger": trigger}


def test_run_states_tell_a_restart_and_a_stop_from_a_failure() -> None:
    assert model.run_state(_run("interrupted", "tether restarted during this run")) == (
        "restarted",
        "interrupted by a restart",
    )
    assert model.run_state(_run("interrupted", "interrupted")) == ("stopped", "stopped")
    assert model.run_state(_run("failed", "boom")) == ("failed", "failed")
    assert model.run_state(_run("completed")) == ("completed", "completed")


def test_a_thread_resumed_after_a_restart_is_not_settled_alone() -> None:
    summary = {"threadId": "thr_1", "attention": "settled", "lastRun": _run("completed", trigger="restart")}
    row = model.thread_row(summary, CTX)
    assert row["flags"] == [{"css": "restarted", "words": "resumed after a restart"}]
    failed = {"threadId": "thr_2", "attention": "failed", "lastRun": _run("failed", "ruff found 3 errors")}
    assert model.thread_row(failed, CTX)["failure"] == "ruff found 3 errors"
    assert model.thread_row({"threadId": "thr_3", "attention": "settled"}, CTX)["flags"] == []


def _task(task_id: str, status: str, text: str | None, **extra: Any) -> dict[str, Any]:
    return {
        "taskId": task_id,
        "status": status,
        "result": {"text": text, "status": status} if status not in model.OPEN else None,
        "createdAt": "2026-01-01T00:00:00.000Z",
        "completedAt": "2026-01-01T00:00:07.000Z" if status not in model.OPEN else None,
        **extra,
    }


def test_a_late_answer_reads_result_then_follow_up() -> None:
    root = _task("tsk_1", "completed", "WAITING", title="suite")
    follow = _task("tsk_2", "completed", "FINAL", followUpOf="tsk_1")
    card = model.task_card(root, [follow], CTX, "o", "thr_p")
    assert [(a["as"], a["text"]) for a in card["answers"]] == [("result", "WAITING"), ("follow-up", "FINAL")]
    assert card["latestStatus"] == "completed" and card["elapsed"] == "7 s"


def test_deadlines_show_only_while_open() -> None:
    open_task = _task("tsk_1", "running", None, deadlineAt="2026-01-01T00:10:00.000Z")
    assert model.deadline_fields(open_task) == {"deadlineAt": "2026-01-01T00:10:00.000Z", "overdue": False}
    late = _task("tsk_1", "running", None, deadlineAt="2026-01-01T00:10:00.000Z", overdue=True)
    assert model.deadline_fields(late) == {"deadlineAt": None, "overdue": True}
    done = _task("tsk_1", "completed", "x", overdue=True)
    assert model.deadline_fields(done) == {"deadlineAt": None, "overdue": False}


def test_a_schedule_counts_down_and_ended_work_moves_out() -> None:
    view = {
        "threadId": "thr_1",
        "tasks": [],
        "background": [
            {
                "id": "bg_1",
                "kind": "schedule",
                "status": "running",
                "startedAt": "2026-01-01T00:00:00.000Z",
                "dueAt": "2026-01-01T00:10:00.000Z",
                "text": "look again",
            },
            {
                "id": "bg_2",
                "kind": "command",
                "status": "ended",
                "exitCode": 0,
                "command": "make",
                "startedAt": "2026-01-01T00:00:00.000Z",
                "endedAt": "2026-01-01T00:00:09.000Z",
            },
        ],
    }
    schedule, command = model.background_rows(view, CTX)
    assert schedule["until"] == "2026-01-01T00:10:00.000Z" and schedule["container"] == "background-thr_1"
    assert command["container"] == "background-ended-thr_1" and command["elapsed"] == "9 s"
    assert not command["stoppable"] and command["latest"] == "exit 0"


def test_cancel_and_stop_aim_at_the_open_follow_up() -> None:
    root = _task("tsk_1", "completed", "WAITING", title="suite", followUps=["tsk_2"])
    follow = _task("tsk_2", "running", None, followUpOf="tsk_1")
    card = model.task_card(root, [follow], CTX, "o", "thr_p")
    assert card["open"] and card["cancelId"] == "tsk_2"
    view = {
        "threadId": "thr_p",
        "tasks": [root, follow],
        "background": [
            {"id": "bg_1", "kind": "task", "status": "running", "taskId": "tsk_1", "label": "suite",
             "startedAt": "2026-01-01T00:00:00.000Z"},
        ],
    }  # fmt: skip
    (row,) = model.background_rows(view, CTX)
    assert row["running"] and row["cancelId"] == "tsk_2" and row["status"] == "running"
