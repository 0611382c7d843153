"""A thread's timeline: runs in order, each delegated task as a card after the run that
delegated it, and a monitor's progress runs folded into one live group."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from tether.web.model.context import OPEN, Context, short
from tether.web.model.runs import run_entry
from tether.web.model.tasks import task_card

#: Lines (and progress replies) of a monitor shown in its group on the thread page; the
#: rest are on the monitor's own page, so a thread page stays small however long it ran.
RECENT_LINES = 20


def timeline(view: Mapping[str, Any], ctx: Context, now: datetime | None = None) -> list[dict[str, Any]]:
    """A thread's timeline, oldest first: each run with the messages that started it (shown)
    and what it wrote (folded to "worked for N s"), and each task it delegated as a card
    right after the run that delegated it, its follow-ups inside. A monitor's progress runs
    are one group, placed at its latest activity (:func:`monitor_entry`)."""
    messages = {m["messageId"]: m for m in view.get("messages") or []}
    items = {i["id"]: i for i in view.get("background") or []}
    tasks = {t["taskId"]: t for t in view.get("tasks") or []}
    runs = list(view.get("runs") or [])
    thread_id = view["threadId"]
    entries: list[dict[str, Any]] = []
    keys: dict[str, str] = {}
    by_run: dict[str, list[Mapping[str, Any]]] = {}
    progress: dict[str, list[tuple[int, Mapping[str, Any]]]] = {}
    for message in messages.values():
        by_run.setdefault(message.get("runId") or "", []).append(message)
    for number, run in enumerate(runs, 1):
        inputs = [messages[m] for m in run["trigger"].get("messageIds") or [] if m in messages]
        key = f"{run['queuedAt']}|{number:06d}"
        keys[run["runId"]] = key
        if run["trigger"].get("kind") == "monitor_event":
            progress.setdefault(monitor_of(inputs), []).append((number, run))
            continue
        input_ids = {m["messageId"] for m in inputs}
        outputs = [m for m in by_run.get(run["runId"], []) if m["messageId"] not in input_ids]
        entry = run_entry(run, inputs, outputs, messages, items, tasks, ctx, key, thread_id, now)
        entries.append({**entry, "number": number})
    for item_id, group in progress.items():
        entries.append(monitor_entry(item_id, group, messages, items, thread_id, keys[group[-1][1]["runId"]]))
    for message in by_run.get("", []):
        entries.append(
            {
                "kind": "message",
                "id": f"msg-{message['messageId']}",
                "order": f"{message['createdAt']}|",
                "container": f"timeline-{thread_id}",
                "message": message,
            }
        )
    roots = [t for t in tasks.values() if not t.get("followUpOf") or t["followUpOf"] not in tasks]
    for task in roots:
        follow_ups = [t for t in tasks.values() if t.get("followUpOf") == task["taskId"]]
        creator = _creating_run(task, runs)
        order = (keys[creator["runId"]] if creator else task["createdAt"]) + f"|task|{task['createdAt']}"
        entries.append(task_card(task, follow_ups, ctx, order, thread_id))
    entries.sort(key=lambda e: e["order"])
    return entries


def monitor_of(inputs: Iterable[Mapping[str, Any]]) -> str:
    """The monitor whose lines started a progress run ("" when its messages do not say)."""
    found = ((m.get("source") or {}).get("itemId") for m in inputs)
    return next((item_id for item_id in found if item_id), "")


def monitor_log(
    group: list[tuple[int, Mapping[str, Any]]], messages: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """A monitor's lines and the progress replies they drew, oldest first."""
    log: list[dict[str, Any]] = []
    for number, run in group:
        for message_id in run["trigger"].get("messageIds") or []:
            text = (messages.get(message_id) or {}).get("text") or ""
            log += [{"kind": "line", "text": line} for line in text.splitlines()]
        if run.get("reply") is not None:
            log.append({"kind": "reply", "text": run["reply"], "number": number})
    return log


def monitor_entry(
    item_id: str,
    group: list[tuple[int, Mapping[str, Any]]],
    messages: Mapping[str, Mapping[str, Any]],
    items: Mapping[str, Mapping[str, Any]],
    thread_id: str,
    order: str,
    limit: int | None = RECENT_LINES,
) -> dict[str, Any]:
    """Every progress run of one monitor, as one live group: its latest line and reply in
    view, the last ``limit`` lines and replies in a fold, the rest on its own page."""
    item = items.get(item_id) or {}
    log = monitor_log(group, messages)
    lines = [row for row in log if row["kind"] == "line"]
    replies = [row for row in log if row["kind"] == "reply"]
    last_number, last_run = group[-1]
    active = last_run["status"] in OPEN
    return {
        "kind": "monitor",
        "id": f"monitor-{item_id or thread_id}",
        "itemId": item_id,
        "order": order,
        "container": f"timeline-{thread_id}",
        "runIds": [run["runId"] for _, run in group],
        "command": item.get("command") or item.get("label") or "a monitor",
        "itemStatus": item.get("status"),
        "running": item.get("status") == "running",
        "persistent": item.get("persistent"),
        "runs": len(group),
        "lineCount": len(lines),
        "latestLine": short(lines[-1]["text"], 200) if lines else None,
        "latestReply": replies[-1]["text"] if replies else None,
        "numbers": (group[0][0], last_number),
        "active": active,
        "activeStatus": last_run["status"] if active else None,
        "failed": sum(1 for _, run in group if run["status"] == "failed"),
        "shown": log if limit is None else log[-limit:],
        "hidden": 0 if limit is None else max(0, len(log) - limit),
        "since": item.get("startedAt"),
    }


def monitor_page(view: Mapping[str, Any], item_id: str) -> dict[str, Any] | None:
    """One monitor's whole log (lines and progress replies), for its own page."""
    messages = {m["messageId"]: m for m in view.get("messages") or []}
    items = {i["id"]: i for i in view.get("background") or []}
    group = []
    for number, run in enumerate(view.get("runs") or [], 1):
        inputs = [messages[m] for m in run["trigger"].get("messageIds") or [] if m in messages]
        if run["trigger"].get("kind") == "monitor_event" and monitor_of(inputs) == item_id:
            group.append((number, run))
    if not group:
        return None
    return monitor_entry(item_id, group, messages, items, view["threadId"], "", limit=None)


def _creating_run(task: Mapping[str, Any], runs: list[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    found = None
    for run in runs:
        if run.get("progress"):
            continue
        started = run.get("startedAt")
        if started and started <= task["createdAt"]:
            found = run
    return found
