"""Reading a parent's completion wakes (SPEC §1: each task reported once, with its result)."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

WAKE_ENTRY = re.compile(r"^\[(?:task|follow-up of \S+) (tsk_[0-9A-Za-z]+)[^\n]*\]\n", re.MULTILINE)


def wake_messages(view: dict[str, Any]) -> list[dict[str, Any]]:
    """Completion wakes: notifications with ``source.kind`` ``delegated_task``."""
    return [
        m
        for m in view["messages"]
        if m["role"] == "notification" and (m["source"] or {}).get("kind") == "delegated_task"
    ]


def runs_of(view: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [r for r in view["runs"] if r["trigger"]["kind"] == kind]


def wake_runs(view: dict[str, Any]) -> list[dict[str, Any]]:
    return runs_of(view, "delegated_task")


def wake_entries(text: str) -> list[tuple[str, str]]:
    """``[(taskId, result text)]`` of one wake text."""
    marks = list(WAKE_ENTRY.finditer(text))
    entries = []
    for n, mark in enumerate(marks):
        end = marks[n + 1].start() if n + 1 < len(marks) else len(text)
        entries.append((mark.group(1), text[mark.end() : end].strip()))
    return entries


def reported(view: dict[str, Any]) -> Counter[str]:
    """How many times each task id was reported across all of a parent's wakes."""
    seen: Counter[str] = Counter()
    for message in wake_messages(view):
        for task_id, _ in wake_entries(message["text"]):
            seen[task_id] += 1
    return seen


def finals(view: dict[str, Any]) -> Counter[str]:
    """How many times each task id's entry says FINAL across a parent's wakes."""
    seen: Counter[str] = Counter()
    for message in wake_messages(view):
        for task_id, body in wake_entries(message["text"]):
            seen[task_id] += body.count("FINAL")
    return seen
