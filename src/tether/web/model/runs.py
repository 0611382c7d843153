"""A run for a person: why it started (its trigger in words), what it wrote, and its state
— a run stopped on purpose or cut off by a restart is neither a failure nor a success."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from tether.web.model.context import OPEN, Context, elapsed, short


def _code(text: str | None) -> str:
    return f"`{short(text, 80)}`" if text else "a command"


def trigger_label(
    run: Mapping[str, Any],
    messages: Mapping[str, Mapping[str, Any]],
    items: Mapping[str, Mapping[str, Any]],
    tasks: Mapping[str, Mapping[str, Any]],
    ctx: Context | None = None,
) -> str:
    """Why a run started, in a person's words: ``woken: command `npm test` exited 0``."""
    trigger = run.get("trigger") or {}
    kind = trigger.get("kind")
    inputs = [messages[m] for m in trigger.get("messageIds") or [] if m in messages]
    sources = [m.get("source") or {} for m in inputs]
    if kind == "user":
        return "message from a person"
    if kind == "task":
        origin = next((s.get("origin") for s in sources if s.get("origin")), None) or {}
        where = f" in {ctx.name(origin.get('environmentId'))}" if ctx and origin.get("environmentId") else ""
        return f"started: delegated task from thread {origin.get('threadId', '?')}{where}"
    if kind == "message":
        origin = next((s.get("origin") for s in sources if s.get("origin")), None) or {}
        where = f" in {ctx.name(origin.get('environmentId'))}" if ctx and origin.get("environmentId") else ""
        return f"message from thread {origin.get('threadId') or '?'}{where}"
    if kind in ("background_command", "monitor_finished", "monitor_event"):
        return _item_label(kind, sources, inputs, items)
    if kind == "scheduled":
        texts = [short(m.get("text"), 60) for m in inputs]
        return "woken: scheduled wake" + (f" “{texts[0]}”" if texts and texts[0] else "")
    if kind == "delegated_task":
        return _wake_label(trigger.get("taskIds") or [], tasks)
    if kind == "restart":
        lost = [s for s in sources if s.get("itemId")]
        if lost:
            item = items.get(lost[0]["itemId"]) or {}
            what = f"{item.get('kind', 'work')} {_code(item.get('command'))}"
            return f"woken: tether restarted and {what} was lost"
        return "woken: tether restarted during a run"
    return f"trigger {kind}"


def _item_label(
    kind: str,
    sources: list[Mapping[str, Any]],
    inputs: list[Mapping[str, Any]],
    items: Mapping[str, Mapping[str, Any]],
) -> str:
    with_item = [s for s in sources if s.get("itemId")]
    item = items.get(with_item[-1]["itemId"], {}) if with_item else {}
    command = _code(item.get("command") or item.get("label"))
    if kind == "monitor_event":
        lines = sum(len((m.get("text") or "").splitlines()) for m in inputs)
        return f"progress: monitor {command} printed {lines} line{'s' if lines != 1 else ''}"
    ending = next(
        (s for s in reversed(with_item) if s.get("kind") == kind), with_item[-1] if with_item else {}
    )
    code = ending.get("exitCode")
    if code is None:
        code = item.get("exitCode")
    if kind == "background_command":
        how = f"exited {code}" if code is not None else f"ended ({item.get('reason') or item.get('status')})"
        return f"woken: command {command} {how}"
    how = f"exit {code}" if code is not None else item.get("reason") or item.get("status") or "ended"
    return f"woken: monitor {command} ended ({how})"


def _wake_label(task_ids: list[str], tasks: Mapping[str, Mapping[str, Any]]) -> str:
    parts = []
    for task_id in task_ids:
        task = tasks.get(task_id) or {}
        title = f" “{task['title']}”" if task.get("title") else f" {task_id}"
        kind = "follow-up of task" if task.get("followUpOf") else "task"
        parts.append(f"{kind}{title} {task.get('status', 'finished')}")
    return "woken: " + ("; ".join(parts) if parts else "a delegated task finished")


def run_entry(
    run: Mapping[str, Any],
    inputs: list[Mapping[str, Any]],
    outputs: list[Mapping[str, Any]],
    messages: Mapping[str, Mapping[str, Any]],
    items: Mapping[str, Mapping[str, Any]],
    tasks: Mapping[str, Mapping[str, Any]],
    ctx: Context,
    order: str,
    thread_id: str,
    now: datetime | None = None,
) -> dict[str, Any]:
    status = run["status"]
    started, ended = run.get("startedAt"), run.get("endedAt")
    if status == "queued":
        worked = "queued"
    elif status == "running":
        worked = "working for"
    elif started and ended:
        worked = f"worked for {elapsed(started, ended)}"
    else:
        worked = "never started"
    reply = run.get("reply")
    state, words = run_state(run)
    # The reply is shown outside the fold; an assistant message with the same text is not
    # shown twice.
    folded = [m for m in outputs if not (m.get("role") == "assistant" and m.get("text") == reply)]
    return {
        "kind": "run",
        "id": f"run-{run['runId']}",
        "order": order,
        "container": f"timeline-{thread_id}",
        "run": run,
        "seq": run.get("seq"),
        "label": trigger_label(run, messages, items, tasks, ctx),
        "triggerKind": run["trigger"].get("kind"),
        "inputs": [m for m in inputs if m.get("role") == "user"],
        "notifications": [m for m in inputs if m.get("role") != "user"],
        "folded": folded,
        "reply": reply,
        "error": run.get("error") if status == "failed" else None,
        "why": run.get("error") if status in ("interrupted", "cancelled") else None,
        "status": status,
        "state": state,
        "stateWords": words,
        "worked": worked,
        "since": started or run.get("queuedAt") if status in OPEN else None,
        "progress": bool(run.get("progress")),
    }


RESTARTED = "restarted"


def run_state(run: Mapping[str, Any] | None) -> tuple[str, str]:
    """A run's status for a person: a run cut off by a restart, or stopped on purpose, is
    neither a failure nor a success (``(css class, words)``)."""
    if run is None:
        return "none", "no run yet"
    status, error = run.get("status") or "", run.get("error") or ""
    if status == "interrupted" and "restart" in error:
        return RESTARTED, "interrupted by a restart"
    if status == "interrupted":
        return "stopped", "stopped"
    return status, status


def thread_flags(last_run: Mapping[str, Any] | None) -> list[dict[str, str]]:
    """Badges a thread's last answer run earns beside its group: cut off by a restart,
    stopped on purpose."""
    if not last_run:
        return []
    state, words = run_state(last_run)
    if state in (RESTARTED, "stopped"):
        return [{"css": state, "words": words}]
    if last_run.get("trigger") == "restart":
        return [{"css": RESTARTED, "words": "resumed after a restart"}]
    return []
