"""Which fragments of the page a batch of feed events changes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def affected(
    events: Iterable[Mapping[str, Any]], view: str, subject: str | None, local: str
) -> set[tuple[str, ...]]:
    """The fragments a batch of events changes, for one view of the page.

    ``events`` are the feed's events (``{type, threadId, runId, taskId, data}``) in any
    order, duplicates included: the answer is a set of keys, and each key is re-rendered
    from the store as it is *now*, so a late or repeated event changes nothing more.

    Keys: ``("row", threadId)``, ``("remote-row", environmentId, threadId)``,
    ``("summary",)`` for the threads list; ``("head",)``, ``("run", runId)``,
    ``("task", rootTaskId)``, ``("item", itemId)``, ``("ledger", taskId)`` for a thread;
    ``("reload",)`` for a thread of a linked environment.
    """
    keys: set[tuple[str, ...]] = set()
    for event in events:
        kind = event.get("type") or ""
        data = event.get("data") if isinstance(event.get("data"), dict) else {}
        thread_id = event.get("threadId")
        if view == "threads":
            keys.add(("summary",))
            if thread_id:
                keys.add(("row", thread_id))
            if kind.startswith("task."):
                if data.get("parentEnvironmentId") == local and data.get("parentThreadId"):
                    keys.add(("row", data["parentThreadId"]))
                child_env, child = data.get("childEnvironmentId"), data.get("childThreadId")
                if child and child_env == local:
                    keys.add(("row", child))
                elif child and child_env:
                    keys.add(("remote-row", child_env, child))
        elif view == "thread":
            keys |= _thread_keys(kind, data, event, subject)
        elif view == "remote" and kind.startswith("task.") and data.get("childThreadId") == subject:
            keys.add(("reload",))
    return keys


def _thread_keys(
    kind: str, data: Mapping[str, Any], event: Mapping[str, Any], subject: str | None
) -> set[tuple[str, ...]]:
    keys: set[tuple[str, ...]] = set()
    mine = event.get("threadId") == subject
    if kind.startswith("task."):
        if data.get("parentThreadId") == subject:
            keys.add(("task", data.get("followUpOf") or data.get("taskId") or ""))
            keys.add(("ledger", data.get("taskId") or ""))
            if data.get("followUpOf"):
                keys.add(("ledger", data["followUpOf"]))
            keys.add(("head",))
        if data.get("childThreadId") == subject:
            keys.add(("head",))
        return keys
    if not mine:
        return keys
    keys.add(("head",))
    if kind.startswith("run."):
        run_id = event.get("runId") or data.get("runId")
        if run_id:
            keys.add(("run", run_id))
        trigger = data.get("trigger") or {}
        for task_id in trigger.get("taskIds") or []:
            keys.add(("ledger", task_id))
    elif kind.startswith("message."):
        run_id = data.get("runId") or event.get("runId")
        if run_id:
            keys.add(("run", run_id))
    elif kind.startswith("item."):
        if data.get("id"):
            keys.add(("item", data["id"]))
        if data.get("taskId"):
            keys.add(("task", data["taskId"]))
    return keys
