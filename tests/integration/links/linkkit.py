"""Helpers for the linked-environment integration tests: real ``tether serve`` processes,
links between them, parent scripts, and event-driven waits.

Every wait here is driven by the servers' event feeds (``follow_events``) or by
``/api/threads/{id}/wait``; the few bounded polls are for state that has no event (a
link's status, a process being reaped, a cursor in another process's store) and say so.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from kit import new_thread, tasks_of, thread, wake_messages
from tether.launch import Server, follow_events
from tether.probes import finished, outcome, parent_script

T = TypeVar("T")

PROBE_TIMEOUT = 60.0  # upper bound for one probe to finish; they take 1 to 4 s
POLL_INTERVAL = 0.05

#: what a local child delivers ``FINAL`` as, per probe (SPEC §8)
EXPECTED_AS = {1: "follow-up", 2: "result", 3: "result", 4: "result", 5: "follow-up", 6: "follow-up"}


# ---------------------------------------------------------------------- servers


def cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """``tether ARGS...`` as a user runs it."""
    return subprocess.run([sys.executable, "-m", "tether", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


# ---------------------------------------------------------------------- threads and scripts


def parent_of(child: dict[str, Any], environment: str | None, title: str = "child") -> dict[str, Any]:
    """A parent script that delegates ``child`` (async) and notes every wake it gets."""
    delegate: dict[str, Any] = {"task": child, "id": "c", "title": title}
    if environment:
        delegate["environment"] = environment
    return {"tether_script": 1, "rules": [
        {"on": "start", "do": [{"delegate": delegate}, {"reply": "delegated"}]},
        {"on": "delegated_task", "repeat": True, "do": [{"reply": "got {{text}}"}]},
    ]}


def await_on(server: Server, check: Callable[[], T], timeout: float, what: str) -> T:
    """Re-check after every event of ``server``'s feed until ``check()`` is truthy."""
    result = follow_events(server.url, server.token, check, timeout)
    assert result, f"timed out after {timeout}s waiting for {what}"
    return result


def await_finished(origin: Server, parent_id: str, timeout: float = PROBE_TIMEOUT
                   ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Until FINAL is a result, every task is delivered and the parent is settled."""
    def check() -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
        tasks, parent = tasks_of(origin, parent_id), thread(origin, parent_id)
        broken = parent["settled"] and (not tasks or any(r["status"] == "failed" for r in parent["runs"]))
        return (tasks, parent) if finished(tasks, parent) or broken else None

    tasks, parent = await_on(origin, check, timeout, f"parent {parent_id} to receive FINAL")
    assert finished(tasks, parent), ("the parent settled without FINAL", parent["runs"], tasks)
    return tasks, parent


def final_count(parent: dict[str, Any]) -> int:
    return sum(m["text"].count("FINAL") for m in wake_messages(parent))


def assert_delivered_once(tasks: list[dict[str, Any]], parent: dict[str, Any]) -> None:
    """FINAL reached the parent exactly once, and each task woke it exactly once (G3)."""
    assert final_count(parent) == 1, [m["text"] for m in wake_messages(parent)]
    carried = [t for m in wake_messages(parent) for t in m["source"]["taskIds"]]
    assert sorted(carried) == sorted(t["taskId"] for t in tasks), (carried, tasks)
    for task in tasks:
        assert task["delivery"]["state"] == "acknowledged", task
    assert sum(1 for t in tasks if (t["result"] or {}).get("text") == "FINAL") == 1, tasks
    assert all(r["status"] == "completed" for r in parent["runs"]), parent["runs"]


def remote_child_started(origin: Server, peer: Server, parent_id: str,
                         ready: Callable[[dict[str, Any]], bool], timeout: float = 30.0
                         ) -> tuple[str, dict[str, Any]]:
    """Until the origin knows the remote child's thread id and, on the peer, ``ready(child)``."""
    def child_id() -> str | None:
        tasks = tasks_of(origin, parent_id)
        return (tasks[0]["childThreadId"] or None) if tasks else None

    child = await_on(origin, child_id, timeout, "the peer to accept the task")

    def check() -> dict[str, Any] | None:
        view = thread(peer, child)
        return view if ready(view) else None

    return child, await_on(peer, check, timeout, f"child {child} on {peer.name}")


def first_run_done_with_command(view: dict[str, Any]) -> bool:
    """The child answered its first run and its background command is running."""
    commands = [i for i in view["background"] if i["kind"] == "command"]
    first = view["runs"][0] if view["runs"] else None
    return bool(commands) and commands[0]["status"] == "running" and first is not None \
        and first["status"] == "completed"


# ---------------------------------------------------------------------- probes


def run_probe(origin: Server, child_env: Server, probe: int, where: str, seconds: float = 1.0
              ) -> dict[str, Any]:
    """Probe ``probe`` of SPEC §8 with its parent in ``origin``; what the parent received,
    plus the raw records to check."""
    environment = child_env.name if where == "remote" else None
    parent_id = new_thread(origin, parent_script(probe, environment, seconds), f"probe {probe} ({where})")
    tasks, parent = await_finished(origin, parent_id)
    child = thread(child_env if where == "remote" else origin, tasks[0]["childThreadId"])
    return {"outcome": outcome(probe, where, tasks, parent, child["runs"]),
            "tasks": tasks, "parent": parent, "child": child, "parentId": parent_id}


def run_probes(jobs: list[tuple[Server, Server, int, str]], seconds: float = 1.0) -> list[dict[str, Any]]:
    """Several probes at once (threads): each is mostly waiting."""
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = [pool.submit(run_probe, o, c, p, w, seconds) for o, c, p, w in jobs]
        return [f.result() for f in futures]


# ---------------------------------------------------------------------- store and processes


def read_link_row(db: Path, environment_id: str) -> dict[str, Any]:
    """A link as stored in an environment's SQLite file (read-only; WAL lets us read live)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
        row = conn.execute("SELECT data FROM links WHERE environment_id = ?", (environment_id,)).fetchone()
    assert row is not None, f"no link to {environment_id} in {db}"
    return dict(json.loads(row[0]))


def await_delivered(origin: Server, parent_id: str, count: int, timeout: float = 30.0
                    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Until ``count`` tasks (or more) are terminal and delivered and the parent is settled,
    whatever their results."""
    def check() -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
        tasks, parent = tasks_of(origin, parent_id), thread(origin, parent_id)
        done = len(tasks) >= count and parent["settled"] and all(
            t["status"] not in ("queued", "running")
            and t["delivery"]["state"] in ("acknowledged", "disposed") for t in tasks)
        return (tasks, parent) if done else None

    return await_on(origin, check, timeout, f"{count} tasks of {parent_id} to be delivered")
