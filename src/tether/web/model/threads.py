"""The threads list (rows grouped by attention, children nested under their parent) and a
thread page's head."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tether.domain.attention import ORDER
from tether.web.model.context import GROUP_HINTS, GROUP_TITLES, OPEN, Context, short
from tether.web.model.runs import thread_flags


def thread_row(
    summary: Mapping[str, Any],
    ctx: Context,
    background: int | None = None,
    parent_title: str | None = None,
) -> dict[str, Any]:
    """One row of the threads list, from a thread summary (``GET /api/threads``). A child of
    a thread here (whichever environment the child runs in) goes into its parent's row."""
    environment_id = summary.get("environmentId") or ctx.source
    local = environment_id == ctx.local
    thread_id = summary["threadId"]
    attention = summary.get("attention") or "settled"
    since = summary.get("attentionSince")
    parent = summary.get("parentThreadId")
    nested = bool(parent) and summary.get("parentEnvironmentId") == ctx.local
    return {
        "id": ("thread-" if local else "rthread-") + thread_id,
        "threadId": thread_id,
        "href": ctx.thread_href(environment_id, thread_id),
        "title": summary.get("title") or (f"task of “{parent_title}”" if parent_title else "untitled"),
        "provider": summary.get("provider"),
        "environment": ctx.name(environment_id),
        "local": local,
        "attention": attention,
        "since": since if attention in ("working", "waiting") else None,
        "status": summary.get("status"),
        "taskId": summary.get("taskId"),
        "parent": parent,
        "parentTitle": parent_title,
        "parentHref": ctx.thread_href(summary.get("parentEnvironmentId"), parent),
        "background": background,
        "order": summary.get("createdAt") or "",
        "container": f"kids-{parent}" if nested else f"group-{attention}",
        "kidsId": f"kids-{thread_id}",
        "kids": [],
        "stale": summary.get("stale"),
        **run_flags(summary, attention),
    }


def group_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The groups in the order of what needs a person, each a list of trees: a thread with
    the threads its tasks created inside it (oldest first), roots newest first. A child
    whose parent is not in the list stands in its own group."""
    rows = list(rows)
    by_kids = {row["kidsId"]: row for row in rows}
    groups: dict[str, list[dict[str, Any]]] = {name: [] for name in ORDER}
    for row in sorted(rows, key=lambda r: r["order"]):
        parent = by_kids.get(row["container"])
        if parent is not None and parent is not row:
            parent["kids"].append(row)
            continue
        row["container"] = f"group-{row['attention']}"
        groups.setdefault(row["attention"], []).append(row)
    return [
        {
            "name": name,
            "title": GROUP_TITLES.get(name, name),
            "hint": GROUP_HINTS.get(name, ""),
            "rows": found[::-1],
            "open": name != "settled",
        }
        for name, found in groups.items()
    ]


def run_flags(summary: Mapping[str, Any], attention: str) -> dict[str, Any]:
    """What the thread's last answer run says beside its group: why it failed, or that it
    was stopped or cut off by a restart (never a green "settled" alone)."""
    last = summary.get("lastRun")
    return {
        "flags": thread_flags(last),
        "failure": (last or {}).get("error") if attention == "failed" else None,
    }


def thread_head(
    view: Mapping[str, Any], ctx: Context, own_task: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    attention = view.get("attention") or ("settled" if view.get("settled") else "working")
    running = [i for i in view.get("background") or [] if i["status"] == "running"]
    waiting_for = [
        f"{i['kind']} “{short(i.get('command') or i.get('label') or i.get('text') or i['id'], 60)}”"
        for i in running
    ] + [
        f"task “{t.get('title') or t['taskId']}” (its child is still at work: a follow-up may come)"
        for t in view.get("tasks") or []
        if t.get("childActive") and t["status"] not in OPEN
    ]
    active = [r for r in view.get("runs") or [] if r["status"] in OPEN]
    return {
        "id": f"head-{view['threadId']}",
        "threadId": view["threadId"],
        "title": view.get("title") or "untitled",
        "environment": ctx.name(view.get("environmentId") or ctx.source),
        "provider": view.get("provider"),
        "model": view.get("model"),
        "status": view.get("status"),
        "attention": attention,
        "attentionTitle": GROUP_TITLES.get(attention, attention),
        "since": view.get("attentionSince") if attention in ("working", "waiting") else None,
        "parentId": view.get("parentThreadId"),
        "parentHref": ctx.thread_href(view.get("parentEnvironmentId"), view.get("parentThreadId")),
        "parentEnvironment": ctx.name(view.get("parentEnvironmentId"))
        if view.get("parentThreadId")
        else None,
        "taskId": view.get("taskId"),
        "ownTask": own_task,
        "background": len(running),
        "activeRuns": [{"runId": r["runId"], "seq": r.get("seq"), "status": r["status"]} for r in active],
        "running": any(r["status"] == "running" for r in active),
        "cancelled": view.get("cancelled"),
        "waitingFor": waiting_for if attention == "waiting" else [],
        **run_flags(view, attention),
    }
