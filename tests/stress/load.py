"""Mixed load (SPEC §9 "mixed load", issue #9): many clients at once against real servers —
the admin, a link token, a per-thread credential; reads, writes, the SSE feed, MCP tool
calls and the web page — each recording every answer's status and time.

Used by ``tests/stress/test_load.py`` (0 5xx, answers unchanged) and by ``bench/run.py``
(requests/s, p50/p99 beside an idle baseline). Its loops are bounded by a stop event and a
deadline, and it only talks to the loopback servers it is given.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "load", "version": "1"}}}
QUICK_SCRIPT = json.dumps({"tether_script": 1, "rules": [{"on": "start", "do": [{"reply": "done"}]}]})


@dataclass
class Client:
    """One kind of caller: where it talks, with which token, and what it may read."""

    name: str
    url: str
    token: str
    #: A thread this caller may read (its own, for a thread credential).
    thread_id: str | None = None
    #: Whether it may create threads (admin and link tokens; not a thread credential).
    writes: bool = True
    #: Whether it also loads the web page (the admin, signed in).
    web: bool = False


@dataclass
class Record:
    statuses: Counter[int] = field(default_factory=Counter)
    #: Answers per client name, so a run can show every client really took part.
    per_client: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, what: str, status: int, seconds: float, body: str = "") -> None:
        with self.lock:
            self.statuses[status] += 1
            self.per_client[what.split(" ", 1)[0]] += 1
            self.latencies.append(seconds)
            if status >= 500:
                self.failures.append(f"{what}: {status} {body[:300]}")

    def broke(self, what: str, error: Exception) -> None:
        with self.lock:
            self.failures.append(f"{what}: {type(error).__name__}: {error}")

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())


def _timed(record: Record, what: str, call: Callable[[], httpx.Response]) -> httpx.Response | None:
    start = time.perf_counter()
    try:
        answer = call()
    except httpx.HTTPError as error:
        record.broke(what, error)
        return None
    record.add(what, answer.status_code, time.perf_counter() - start, answer.text)
    return answer


def _mcp_result(answer: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC answer of one MCP post (a JSON body or one SSE ``data:`` line)."""
    if answer.headers.get("content-type", "").startswith("text/event-stream"):
        for line in answer.text.splitlines():
            if line.startswith("data:"):
                return dict(json.loads(line[5:]))
        return {}
    return dict(answer.json())


class _Worker:
    """One client's loop: a random mix of what that caller does, until told to stop."""

    def __init__(self, client: Client, record: Record, seed: int) -> None:
        self.client = client
        self.record = record
        self.rng = random.Random(seed)
        self.http = httpx.Client(base_url=client.url, timeout=30,
                                 headers={"Authorization": f"Bearer {client.token}"})
        self.session: str | None = None

    def run(self, stop: threading.Event) -> None:
        actions = [self.read_threads, self.read_tasks, self.read_thread, self.mcp_call, self.events]
        if self.client.writes:
            actions.append(self.write)
        if self.client.web:
            actions.append(self.web_page)
        with self.http:
            while not stop.is_set():
                self.rng.choice(actions)()

    def _get(self, what: str, path: str, **params: Any) -> httpx.Response | None:
        return _timed(self.record, f"{self.client.name} {what}", lambda: self.http.get(path, params=params))

    def read_threads(self) -> None:
        self._get("GET /api/threads", "/api/threads")

    def read_tasks(self) -> None:
        self._get("GET /api/tasks", "/api/tasks")

    def read_thread(self) -> None:
        if self.client.thread_id:
            self._get("GET thread", f"/api/threads/{self.client.thread_id}")

    def events(self) -> None:
        """An SSE read from the oldest event until caught up (the first keepalive, or 200
        events): what a reconnecting follower does."""
        what = f"{self.client.name} SSE"
        start = time.perf_counter()
        try:
            with self.http.stream("GET", "/api/events", params={"after": "0", "keepalive": "0.1"}) as answer:
                for n, line in enumerate(answer.iter_lines()):
                    if line.startswith(": keepalive") or n >= 600:
                        break
                self.record.add(what, answer.status_code, time.perf_counter() - start)
        except httpx.HTTPError as error:
            self.record.broke(what, error)

    def write(self) -> None:
        body = {"provider": "script", "title": "load", "message": QUICK_SCRIPT}
        _timed(self.record, f"{self.client.name} POST /api/threads",
               lambda: self.http.post("/api/threads", json=body))

    def web_page(self) -> None:
        self._get("GET /", "/")

    def mcp_call(self) -> None:
        what = f"{self.client.name} MCP"
        if self.session is None:
            opened = _timed(
                self.record, what, lambda: self.http.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS)
            )
            if opened is None or opened.status_code != 200:
                return
            self.session = opened.headers.get("mcp-session-id")
        name, arguments = ("thread_list", {})
        if self.client.thread_id and self.rng.random() < 0.5:
            name, arguments = "thread_read", {"threadId": self.client.thread_id, "limit": 20}
        params = {"name": name, "arguments": arguments}
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params}
        headers = {**MCP_HEADERS, **({"mcp-session-id": self.session} if self.session else {})}
        answer = _timed(self.record, what, lambda: self.http.post("/mcp", json=call, headers=headers))
        if answer is not None and answer.status_code == 200:
            result = _mcp_result(answer).get("result") or {}
            if result.get("isError"):
                self.record.broke(what, RuntimeError(f"{name} failed: {result.get('content')}"))


def run_load(clients: list[Client], stop: threading.Event, deadline: float, seed: int,
             record: Record | None = None) -> Record:
    """Run one worker per client until ``stop`` is set or ``deadline`` (seconds) passes."""
    record = record or Record()
    timer = threading.Timer(deadline, stop.set)
    timer.start()
    try:
        with ThreadPoolExecutor(len(clients)) as pool:
            workers = [_Worker(c, record, seed + n) for n, c in enumerate(clients)]
            for future in [pool.submit(w.run, stop) for w in workers]:
                future.result()
    finally:
        timer.cancel()
    return record
