"""Delegated work on a thread's page: task cards with every answer as the parent received
it, the background rows (commands, monitors, schedules, tasks) and the delivery ledger."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from tether.web.model.context import OPEN, Context, elapsed, short


def deadline_fields(task: Mapping[str, Any]) -> dict[str, Any]:
    """A task's deadline (SPEC §11), when the task view has one: ``deadlineAt`` for a
    countdown while it is open, ``overdue`` once it passed."""
    open_ = task.get("status") in OPEN
    return {
        "deadlineAt": task.get("deadlineAt") if open_ and not task.get("overdue") else None,
        "overdue": bool(task.get("overdue")) and open_,
    }


def answer_rows(task: Mapping[str, Any], follow_ups: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The task's answers as its parent received them: the result, then each follow-up
    (the one that carried the final answer last)."""
    rows = []
    for n, found in enumerate([task, *follow_ups]):
        result = found.get("result") or {}
        rows.append(
            {
                "taskId": found["taskId"],
                "as": "result" if n == 0 else "follow-up",
                "status": found["status"],
                "open": found["status"] in OPEN,
                "text": result.get("text"),
                "error": result.get("error"),
                "interim": found.get("interim"),
            }
        )
    return rows


def task_card(
    task: Mapping[str, Any],
    follow_ups: list[Mapping[str, Any]],
    ctx: Context,
    order: str,
    thread_id: str,
) -> dict[str, Any]:
    """A delegated task: the child's current or final status and result, and where it lives."""
    child_env = task.get("childEnvironmentId")
    latest = follow_ups[-1] if follow_ups else task
    answers = answer_rows(task, follow_ups)
    ended = latest.get("completedAt") if latest["status"] not in OPEN else None
    return {
        **deadline_fields(latest),
        "answers": answers,
        "latestStatus": latest["status"],
        "cancelId": latest["taskId"],  # the open one: the task, or its open follow-up
        "error": next((a["error"] for a in reversed(answers) if a["error"]), None),
        "elapsed": elapsed(task["createdAt"], ended),
        "since": task["createdAt"] if latest["status"] in OPEN else None,
        "kind": "task",
        "id": f"task-{task['taskId']}",
        "order": order,
        "container": f"timeline-{thread_id}",
        "task": task,
        "title": task.get("title") or task["taskId"],
        "status": task["status"],
        "workState": task.get("workState"),
        "open": task["status"] in OPEN or latest["status"] in OPEN,
        # Ended, but its child still has work that will wake it: a follow-up may come.
        "childActive": bool(latest.get("childActive")) and latest["status"] not in OPEN,
        "environment": ctx.name(child_env),
        "remote": child_env != ctx.local,
        "childHref": ctx.thread_href(child_env, task.get("childThreadId")),
        "progress": (task.get("progress") or [])[-1]["text"] if task.get("progress") else None,
        "followUps": len(follow_ups),
    }


def background_rows(
    view: Mapping[str, Any], ctx: Context, now: datetime | None = None
) -> list[dict[str, Any]]:
    """Each command, monitor, schedule and task of the thread: what, where, status, how long,
    its latest output or progress line, and whether it can be stopped. Running work is in
    ``background-{thread}``; ended work moves to the folded ``background-ended-{thread}``."""
    tasks = {t["taskId"]: t for t in view.get("tasks") or []}
    rows = []
    for item in view.get("background") or []:
        row = _item_fields(item, tasks, ctx)
        running = row["status"] in OPEN
        started, ended = row.pop("times")
        place = "background" if running else "background-ended"
        rows.append(
            {
                **row,
                "id": f"item-{item['id']}",
                "itemId": item["id"],
                "container": f"{place}-{view['threadId']}",
                "order": f"{item['startedAt']}|{item['id']}",
                "kind": item["kind"],
                "label": item.get("label"),
                "running": running,
                "held": item.get("held"),
                "startedAt": started,
                "endedAt": ended,
                "elapsed": elapsed(started, ended, now),
                "taskId": item.get("taskId"),
                "stoppable": running,
            }
        )
    return rows


def _item_fields(
    item: Mapping[str, Any], tasks: Mapping[str, Mapping[str, Any]], ctx: Context
) -> dict[str, Any]:
    """What a background row says about one item: a task by its latest answer and its own
    times, a schedule by its countdown, a command or monitor by its last line or exit."""
    kind, status = item["kind"], item["status"]
    times = (item["startedAt"], item.get("endedAt"))
    until = None
    if kind == "task":
        task = tasks.get(item.get("taskId") or "")
        latest = _latest(task, tasks) if task else None
        what = item.get("label") or (task or {}).get("title") or item.get("taskId")
        target = ctx.name(item.get("environmentId"))
        status = latest["status"] if latest else status
        line = _task_line(latest)
        if task is not None and latest is not None:
            times = (task["createdAt"], latest.get("completedAt") if status not in OPEN else None)
        # a Stop ends the task the child works on now: the latest follow-up, if any
        extra = {**deadline_fields(latest or {}), "cancelId": (latest or {}).get("taskId")}
    elif kind == "schedule":
        what = item.get("text") or "scheduled wake"
        target = ctx.name(ctx.source)
        until = item.get("dueAt") if status == "running" else None
        line = None if until else item.get("reason")
        extra = {}
    else:
        what = item.get("command") or item.get("label") or item["id"]
        target = ctx.name(ctx.source)
        line = item.get("lastLine")
        if item.get("exitCode") is not None and status != "running":
            line = f"exit {item['exitCode']}" + (f" · {line}" if line else "")
        elif item.get("reason") and status != "running":
            line = item["reason"] + (f" · {line}" if line else "")
        extra = {}
    return {
        **extra,
        "what": what,
        "target": target,
        "status": status,
        "latest": short(line, 160),
        "until": until,
        "times": times,
    }


def _latest(task: Mapping[str, Any], tasks: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any]:
    """The task's latest follow-up (or the task): the one whose answer the parent got last."""
    follow_ups = [tasks[f] for f in task.get("followUps") or [] if f in tasks]
    return follow_ups[-1] if follow_ups else task


def _task_line(task: Mapping[str, Any] | None) -> str | None:
    if task is None:
        return None
    result = task.get("result") or {}
    if result.get("text") is not None:
        return str(result["text"])
    if result.get("error"):
        return f"failed: {result['error']}"
    if task.get("progress"):
        return task["progress"][-1].get("text")
    return task.get("interim") or task.get("workState")


LEDGER_WORDS = {
    "result": "as the result",
    "follow-up": "as a follow-up",
    "pending": "pending",
    "cancelled": "cancelled",
    "call": "returned to the waiting call",
    "disposed": "not delivered (the thread itself cancelled it)",
}


def ledger_rows(view: Mapping[str, Any], ctx: Context) -> list[dict[str, Any]]:
    """The API's ledger rows (``view["ledger"]``), with links and words for the page."""
    rows = []
    roots: dict[str, str] = {}
    for entry in view.get("ledger") or []:
        root = entry.get("followUpOf")
        if not root:
            roots[entry["taskId"]] = entry["createdAt"]
        order = f"{roots.get(root or entry['taskId'], entry['createdAt'])}|{root or entry['taskId']}|"
        if root:
            order += entry["createdAt"]
        wake = entry.get("wake") or None
        rows.append(
            {
                **entry,
                "id": f"ledger-{entry['taskId']}",
                "container": f"ledger-{view['threadId']}",
                "order": order,
                "how": LEDGER_WORDS.get(entry["reachedAs"], entry["reachedAs"]),
                "environment": ctx.name(entry.get("childEnvironmentId")),
                "childHref": ctx.thread_href(entry.get("childEnvironmentId"), entry.get("childThreadId")),
                "wakeText": (
                    f"woke run #{wake['runSeq']} ({wake['runStatus']})"
                    if wake and wake.get("runSeq") is not None
                    else ("wake: " + wake["state"] if wake else "no wake yet")
                ),
                "result": short(entry.get("resultText"), 200),
            }
        )
    return rows
