"""Probe 3 under a race: the awaited background command ends just as the child's first run
ends. Repeated hundreds of times, concurrently in one server (G2: no premature completion).

If marking the command ended and queueing its wake run were two steps, or if a task could
complete from a child that still holds an awaited command, some of these tasks would
complete with WAITING (and FINAL would arrive as a follow-up, or never).
"""

from __future__ import annotations

from typing import Any

import pytest

from kit import runs_of, wake_messages, wake_runs
from tether.launch import Server

from .helpers import new_thread, noting_parent, reply, rule, script, tasks_of, thread, wait_settled

REPEATS = 100


def child(command: str, *, run_ms: int = 0, separate_wait: bool = False) -> dict[str, Any]:
    """Probe 3's child: start ``command`` in the background, await it, reply WAITING (after
    ``run_ms`` more in the run); reply FINAL when the command's end wakes it."""
    actions: list[dict[str, Any]] = [
        {"bash": command, "background": True, "id": "b1", **({} if separate_wait else {"await": True})}
    ]
    if run_ms:
        actions.append({"sleep_ms": run_ms})
    if separate_wait:
        actions.append({"background_wait": "b1"})
    actions.append(reply("WAITING"))
    return script(rule("start", *actions), rule("background_command", reply("FINAL")))


def variants() -> list[tuple[str, dict[str, Any]]]:
    found = [(f"true#{n}", child("true")) for n in range(REPEATS)]
    for n in range(REPEATS):
        # The command's end and the run's end land within a few ms of each other, in either
        # order; half of them mark the command awaited only after starting it.
        delay = 10 + 10 * (n % 5)
        run_ms = delay + (n % 3 - 1) * 5
        found.append(
            (f"sleep#{n}", child(f"sleep 0.0{delay // 10}", run_ms=run_ms, separate_wait=n % 2 == 1))
        )
    return found


@pytest.fixture(scope="module")
def races(shared_server: Server) -> list[dict[str, Any]]:
    with shared_server.client() as client:
        started = [
            (name, new_thread(client, noting_parent(script_), title=name)) for name, script_ in variants()
        ]
        records = []
        for _, parent_id in started:
            wait_settled(client, parent_id, timeout=120)
        for name, parent_id in started:
            tasks = tasks_of(client, parent_id)
            records.append(
                {
                    "name": name,
                    "parent": thread(client, parent_id),
                    "tasks": tasks,
                    "child": thread(client, tasks[0]["childThreadId"]) if tasks else None,
                }
            )
        return records


def test_no_premature_completion(races: list[dict[str, Any]]) -> None:
    assert len(races) >= 2 * REPEATS
    wrong = []
    for record in races:
        roots = [t for t in record["tasks"] if not t["followUpOf"]]
        results = [(t.get("result") or {}).get("text") for t in roots]
        if results != ["FINAL"] or roots[0]["status"] != "completed":
            wrong.append(
                (
                    record["name"],
                    results,
                    [(r["trigger"]["kind"], r["reply"]) for r in (record["child"] or {"runs": []})["runs"]],
                )
            )
    assert not wrong, f"{len(wrong)} of {len(races)} tasks completed prematurely: {wrong[:5]}"


def test_exactly_one_wake_and_no_follow_ups(races: list[dict[str, Any]]) -> None:
    wrong = []
    for record in races:
        parent = record["parent"]
        follow_ups = [t for t in record["tasks"] if t["followUpOf"]]
        wakes = wake_messages(parent)
        if (
            len(wake_runs(parent)) != 1
            or len(wakes) != 1
            or follow_ups
            or wakes[0]["text"].count("FINAL") != 1
            or "WAITING" in wakes[0]["text"]
        ):
            wrong.append((record["name"], [w["text"] for w in wakes], len(follow_ups)))
    assert not wrong, f"{len(wrong)} parents were told wrongly: {wrong[:5]}"


def test_child_answered_once_after_its_command(races: list[dict[str, Any]]) -> None:
    wrong = []
    for record in races:
        child_view = record["child"]
        woken = runs_of(child_view, "background_command")
        command = child_view["background"][0]
        if (
            len(woken) != 1
            or woken[0]["reply"] != "FINAL"
            or command["status"] != "ended"
            or command["exitCode"] != 0
            or not command["awaited"]
        ):
            wrong.append(
                (record["name"], [(r["trigger"]["kind"], r["reply"]) for r in child_view["runs"]], command)
            )
    assert not wrong, f"{len(wrong)} children misbehaved: {wrong[:3]}"
