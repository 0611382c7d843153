"""Helpers of the stress suite: sizes, the seed, real servers, event-driven waits, and the
exactly-once bookkeeping of completion wakes.

Sizes come from ``TETHER_STRESS`` (``small``, the default, runs in every ``pytest``;
``full`` is the SPEC §9 reliability run). The seed comes from ``TETHER_STRESS_SEED`` or is
drawn once per session; it is printed in the summary so a failing run can be replayed.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from kit import wake_entries, wake_messages
from tether.launch import Server

T = TypeVar("T")

SIZE = os.environ.get("TETHER_STRESS", "small").strip().lower() or "small"
if SIZE not in ("small", "full"):
    raise RuntimeError(f"TETHER_STRESS must be 'small' or 'full', not {SIZE!r}")
FULL = SIZE == "full"

_seed_text = os.environ.get("TETHER_STRESS_SEED", "").strip()
SEED = int(_seed_text) if _seed_text else random.SystemRandom().randrange(2**32)

#: Lines printed in the terminal summary: seeds, sizes, and measured values.
REPORT: list[str] = []


def note(line: str) -> None:
    """Print ``line`` now (seen with ``-s``) and in the run's summary (always seen)."""
    print(line, flush=True)
    REPORT.append(line)


def rng_for(name: str) -> random.Random:
    """A generator of its own per test, derived from the session seed: replaying one test
    with the same seed draws the same numbers whatever else ran before it."""
    return random.Random(f"{SEED}:{name}")


# ---------------------------------------------------------------------- servers


def wait_idle(server: Server, thread_id: str, timeout: float = 60.0) -> None:
    """Block (server side) until the thread has no queued or running run."""
    with server.client(timeout=timeout + 30) as client:
        response = client.get(f"/api/threads/{thread_id}/wait", params={"timeoutMs": int(timeout * 1000)})
    assert response.status_code == 200, response.text
    assert not response.json()["timedOut"], f"{thread_id} on {server.name} not idle within {timeout}s"


# ---------------------------------------------------------------------- waiting on events


class Pulse:
    """Wakes a waiter on every line of the event feeds of some servers (an event, or a
    keepalive at most ``keepalive`` seconds apart), so a condition that spans several
    servers and thousands of events is re-checked once per burst, not once per event.

    A feed that breaks (its server was killed) is opened again from ``after=now``: the
    waiter re-checks the full condition after every reconnect, so nothing is missed."""

    def __init__(self, servers: Iterable[Server], keepalive: float = 1.0) -> None:
        self.servers = list(servers)
        self.keepalive = keepalive
        self._flag = threading.Event()
        self._closed = threading.Event()
        self._threads = [threading.Thread(target=self._read, args=(s,), daemon=True) for s in self.servers]

    def __enter__(self) -> Pulse:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()

    def _read(self, server: Server) -> None:
        while not self._closed.is_set():
            try:
                with httpx.stream(
                    "GET", f"{server.url}/api/events",
                    params={"after": "now", "keepalive": str(self.keepalive)},
                    headers={"Authorization": f"Bearer {server.token}"},
                    timeout=httpx.Timeout(self.keepalive * 5 + 5, connect=2.0),
                ) as response:
                    self._flag.set()  # (re)connected: re-check
                    for _ in response.iter_lines():
                        self._flag.set()
                        if self._closed.is_set():
                            return
            except (httpx.HTTPError, OSError):
                pass
            self._flag.set()
            # the server is down or restarting: nothing to await but its return
            self._closed.wait(0.2)

    def wait_for(self, check: Callable[[], T], timeout: float, what: str) -> T:
        """Re-run ``check`` after each burst of events until it is truthy; fail with ``what``."""
        deadline = time.monotonic() + timeout
        while True:
            self._flag.clear()
            result = check()
            if result:
                return result
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
            self._flag.wait(min(left, self.keepalive * 3))


# ---------------------------------------------------------------------- reading wakes


@dataclass
class Ledger:
    """What one parent's wakes reported: how often each task id, and how many FINALs."""

    reported: Counter[str]
    finals: Counter[str]
    problems: list[str]


def ledger(parent: dict[str, Any]) -> Ledger:
    reported: Counter[str] = Counter()
    finals: Counter[str] = Counter()
    problems: list[str] = []
    for message in wake_messages(parent):
        entries = wake_entries(message["text"])
        ids = [task_id for task_id, _ in entries]
        listed = list(message["source"].get("taskIds") or [])
        if sorted(ids) != sorted(listed):
            problems.append(f"wake {message['messageId']} lists {ids} in its text but {listed} in its source")
        if len(set(ids)) != len(ids):
            problems.append(f"wake {message['messageId']} lists a task twice: {ids}")
        for task_id, body in entries:
            reported[task_id] += 1
            finals[task_id] += body.count("FINAL")
    return Ledger(reported, finals, problems)


def check_exactly_once(parents: dict[str, dict[str, Any]], tasks: list[dict[str, Any]],
                       expected_roots: dict[str, int]) -> list[str]:
    """Every problem with G1/G3 across ``parents`` (parent id → thread view) and all their
    ``tasks`` (follow-ups included): each task terminal, acknowledged, reported in exactly
    one wake, FINAL counted exactly once per task whose result is FINAL (zero otherwise),
    and every root task's chain (it and its follow-ups) carrying FINAL at least once."""
    problems: list[str] = []
    by_parent: dict[str, list[dict[str, Any]]] = {p: [] for p in parents}
    for task in tasks:
        if task["parentThreadId"] in by_parent:
            by_parent[task["parentThreadId"]].append(task)
    for parent_id, view in parents.items():
        own = by_parent[parent_id]
        book = ledger(view)
        problems += [f"{parent_id}: {p}" for p in book.problems]
        roots = [t for t in own if not t["followUpOf"]]
        if parent_id in expected_roots and len(roots) != expected_roots[parent_id]:
            problems.append(f"{parent_id}: {len(roots)} root tasks, expected {expected_roots[parent_id]}")
        ids = {t["taskId"] for t in own}
        for stray in set(book.reported) - ids:
            problems.append(f"{parent_id}: a wake reports {stray}, which is not one of its tasks")
        for task in own:
            tid, result = task["taskId"], (task["result"] or {})
            if task["status"] in ("queued", "running"):
                problems.append(f"{tid}: still {task['status']} ({task['workState']})")
                continue
            if task["delivery"]["state"] != "acknowledged":
                problems.append(f"{tid}: delivery {task['delivery']['state']}, not acknowledged")
            if book.reported[tid] != 1:
                problems.append(f"{tid}: reported in {book.reported[tid]} wakes, not exactly 1")
            want = 1 if result.get("text") == "FINAL" else 0
            if book.finals[tid] != want:
                problems.append(f"{tid}: FINAL {book.finals[tid]} times in wakes, "
                                f"result {result.get('text')!r}")
        chains: dict[str, list[dict[str, Any]]] = {t["taskId"]: [t] for t in roots}
        for task in own:
            if task["followUpOf"]:
                chains.setdefault(task["followUpOf"], []).append(task)
        for root_id, chain in chains.items():
            if not any((t["result"] or {}).get("text") == "FINAL" for t in chain):
                texts = [(t["taskId"], t["status"], (t["result"] or {}).get("text")) for t in chain]
                problems.append(f"{root_id}: no task of its chain carries FINAL: {texts}")
        if not view["settled"]:
            problems.append(f"{parent_id}: parent not settled")
        failed = [r["runId"] for r in view["runs"] if r["status"] == "failed"]
        if failed:
            problems.append(f"{parent_id}: failed runs {failed}")
    return problems


# ---------------------------------------------------------------------- processes


