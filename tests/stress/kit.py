"""Helpers of the stress suite: sizes, the seed, real servers, event-driven waits, and the
exactly-once bookkeeping of completion wakes.

Sizes come from ``TETHER_STRESS`` (``small``, the default, runs in every ``pytest``;
``full`` is the SPEC §9 reliability run). The seed comes from ``TETHER_STRESS_SEED`` or is
drawn once per session; it is printed in the summary so a failing run can be replayed.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from tether.launch import Server, free_port

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


class StressServer(Server):
    """A ``tether serve`` whose failure to start says why (its log's tail), and which picks
    another port if the first one it was given was taken before its first start."""

    started = False

    def start(self, timeout: float = 60.0) -> StressServer:
        for attempt in range(3):
            mark = self.log.stat().st_size if self.log.exists() else 0
            try:
                super().start(timeout)
            except RuntimeError as error:
                tail = self.log_tail(mark)
                if not self.started and "address already in use" in tail.lower() and attempt < 2:
                    self.port = free_port()
                    continue
                raise RuntimeError(f"{error}\n--- {self.name}.log ---\n{tail[-3000:]}") from None
            self.started = True
            return self
        raise AssertionError("unreachable")

    def log_tail(self, mark: int = 0) -> str:
        if not self.log.exists():
            return ""
        with open(self.log, "rb") as log:
            log.seek(mark)
            return log.read().decode("utf-8", "replace")

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def get(self, path: str, **params: Any) -> Any:
        with self.client() as client:
            response = client.get(path, params=params or None)
        assert response.status_code == 200, (self.name, path, response.status_code, response.text[:500])
        return response.json()


def start_all(servers: Iterable[Server]) -> None:
    """Start several servers at once (each start takes a second or two on 2 cores)."""
    servers = list(servers)
    with ThreadPoolExecutor(max(1, len(servers))) as pool:
        for future in [pool.submit(s.start) for s in servers]:
            future.result()


def env_id(server: Server) -> str:
    return str(httpx.get(f"{server.url}/api/health", timeout=10).json()["environmentId"])


def mint(peer: Server, label: str) -> dict[str, Any]:
    with peer.client() as client:
        response = client.post("/api/link-tokens", json={"label": label})
    assert response.status_code == 201, response.text
    return dict(response.json())


def link(origin: Server, peer: Server, url: str | None = None) -> dict[str, Any]:
    """Link ``origin`` → ``peer`` (or → ``url``, a proxy in front of it) with a fresh token."""
    token = mint(peer, f"for {origin.name}")
    with origin.client() as client:
        response = client.post("/api/links", json={"url": url or peer.url, "token": token["token"]})
    assert response.status_code in (200, 201), response.text
    return {**token, "link": response.json()}


def new_thread(server: Server, script: dict[str, Any], title: str, token: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {token or server.token}"}
    response = httpx.post(f"{server.url}/api/threads", headers=headers, timeout=60, json={
        "provider": "script", "title": title, "message": json.dumps(script)})
    assert response.status_code == 201, response.text
    return str(response.json()["threadId"])


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


def poll(fn: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Bounded polling, only for state that no event announces. Fails with ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)  # polling interval: there is no event to await for this


# ---------------------------------------------------------------------- reading wakes

WAKE_ENTRY = re.compile(r"^\[(?:task|follow-up of \S+) (tsk_[0-9A-Za-z]+)[^\n]*\]\n", re.MULTILINE)


def wake_messages(view: dict[str, Any]) -> list[dict[str, Any]]:
    """A thread's completion wakes: notifications with ``source.kind`` ``delegated_task``."""
    return [m for m in view["messages"]
            if m["role"] == "notification" and (m["source"] or {}).get("kind") == "delegated_task"]


def wake_entries(text: str) -> list[tuple[str, str]]:
    """``[(taskId, result text)]`` of one wake text (SPEC §1: each task once, with its result)."""
    marks = list(WAKE_ENTRY.finditer(text))
    entries = []
    for n, mark in enumerate(marks):
        end = marks[n + 1].start() if n + 1 < len(marks) else len(text)
        entries.append((mark.group(1), text[mark.end():end].strip()))
    return entries


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


def leftover_wrappers(data: Path) -> Iterator[int]:
    """Pids of the background wrappers of the environment at ``data`` that still run."""
    proc = data / "proc"
    if not proc.is_dir():
        return
    for pid_file in proc.glob("*/pid"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text().strip())
            if str(pid_file.parent).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                yield pid


def shutdown(servers: Iterable[Server]) -> None:
    """SIGKILL the servers and the background commands they left (they outlive tether)."""
    servers = list(servers)
    for server in servers:
        server.kill()
    for server in servers:
        for pid in leftover_wrappers(server.data):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, 9)
