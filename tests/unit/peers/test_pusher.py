"""The link's pusher is supervised: an answer it cannot read (a proxy's garbage, a bug in
a handler) is logged and retried, never the end of the pusher — else every remote task
created after it would stay ``pending`` for good (#9)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from tether.domain.records import Link, Task
from tether.environment import Environment
from tether.types import ADMIN, Caller

PEER = "env_peer"


class FlakyPeer:
    """The peer's side of the link over an in-memory transport: ``garbled`` answers to the
    task creation are unreadable (a 201 whose body is not JSON), the later ones real."""

    def __init__(self, garbled: int) -> None:
        self.garbled = garbled
        self.created: list[str] = []
        self.arrived = asyncio.Event()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path == "/api/tasks":
            if self.garbled > 0:
                self.garbled -= 1
                return httpx.Response(201, text="<html>bad gateway</html>")
            self.created.append(request.read().decode())
            self.arrived.set()
            return httpx.Response(201, json={"childThreadId": "thr_child"})
        return httpx.Response(503, json={"error": {"code": "unavailable", "message": "later"}})


@pytest.fixture
async def origin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Environment, FlakyPeer]]:
    peer = FlakyPeer(garbled=2)
    async with linked_origin(tmp_path, monkeypatch, peer) as env:
        yield env, peer


@contextlib.asynccontextmanager
async def linked_origin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, peer: Callable[[httpx.Request], httpx.Response]
) -> AsyncIterator[Environment]:
    """A started environment linked to ``peer``, which answers over an in-memory transport."""
    in_memory = functools.partial(httpx.AsyncClient, transport=httpx.MockTransport(peer))
    monkeypatch.setattr(httpx, "AsyncClient", in_memory)
    env = Environment(tmp_path / "origin", name="origin")
    with env.store.transaction() as tx:
        tx.put(Link(PEER, "peer", "http://127.0.0.1:9", "secret", "2026-01-01T00:00:00Z"))
    await env.start()
    try:
        yield env
    finally:
        await env.close()


async def test_a_garbled_answer_is_retried_and_the_task_still_reaches_the_peer(
    origin: tuple[Environment, FlakyPeer],
) -> None:
    env, peer = origin
    thread = env.commands.create_thread(ADMIN, "script", "parent")
    caller = Caller("thread", thread_id=thread["threadId"])
    first = await env.peers.resolve(PEER).delegate(caller, "first")
    await asyncio.wait_for(peer.arrived.wait(), 10)
    peer.arrived.clear()
    second = await env.peers.resolve(PEER).delegate(caller, "second")  # the pusher must still be there
    await asyncio.wait_for(peer.arrived.wait(), 10)
    assert [first["taskId"] in body for body in peer.created] == [True, False]
    assert second["taskId"] in peer.created[1]
    with env.store.read() as reader:
        assert {t.remote_pending for t in reader.find(Task)} == {None}


class BatchPeer:
    """A peer that takes new tasks in batches (or, ``batching=False``, an older one that
    does not know the endpoint): the second task exists already, the third is refused."""

    def __init__(self, batching: bool) -> None:
        self.batching = batching
        self.requests: list[tuple[str, int]] = []  # (path, tasks in it)
        self.done = asyncio.Event()
        self.expected = 0

    def _one(self, body: dict[str, object], index: int) -> tuple[int, dict[str, object]]:
        if index == 1:
            return 409, {"error": {"code": "conflict", "message": "exists"}}
        if index == 2:
            return 403, {"error": {"code": "forbidden", "message": "not for you"}}
        return 201, {"taskId": body["taskId"], "childThreadId": f"thr_{index}"}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "POST" and path == "/api/tasks/batch" and self.batching:
            bodies = json.loads(request.read())["tasks"]
            self.requests.append((path, len(bodies)))
            answers = [self._one(body, self.expected + i) for i, body in enumerate(bodies)]
            self.expected += len(bodies)
            results = [
                {"taskId": body["taskId"], "status": status} | (answer if status >= 400 else {"task": answer})
                for body, (status, answer) in zip(bodies, answers, strict=True)
            ]
            return httpx.Response(200, json={"results": results})
        if request.method == "POST" and path == "/api/tasks":
            body = json.loads(request.read())
            self.requests.append((path, 1))
            status, answer = self._one(body, self.expected)
            self.expected += 1
            return httpx.Response(status, json=answer)
        if request.method == "GET" and path.startswith("/api/tasks/"):
            task_id = path.rsplit("/", 1)[-1]
            return httpx.Response(200, json={"taskId": task_id, "childThreadId": "thr_existing"})
        return httpx.Response(405 if path == "/api/tasks/batch" else 503, json={})


@pytest.mark.parametrize("batching", [True, False], ids=["batch", "older peer"])
async def test_new_tasks_go_in_one_batch_and_each_answer_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batching: bool
) -> None:
    """Five tasks delegated at once reach the peer in one request (one per task to a peer
    without the batch endpoint, remembered after its first 405): created ones are sent,
    the existing one is read back, the refused one fails — none is left pending."""
    peer = BatchPeer(batching)
    async with linked_origin(tmp_path, monkeypatch, peer) as env:
        thread = env.commands.create_thread(ADMIN, "script", "parent")
        caller = Caller("thread", thread_id=thread["threadId"])
        link = env.peers.resolve(PEER)
        # Delegating never yields to the loop: the pusher sees all five at once.
        ids = [(await link.delegate(caller, f"task {n}"))["taskId"] for n in range(5)]

        def pushed() -> dict[str, Task] | None:
            with env.commands.view() as view:
                found = {task.id: task for task in view.query(Task)}
            return found if all(found[i].remote_pending is None for i in ids) else None

        found = await env.runtime.notifier.wait_until(["events"], pushed, 10)
        assert found is not None, "a task was left pending"
        assert peer.requests == ([("/api/tasks/batch", 5)] if batching else [("/api/tasks", 1)] * 5)
        assert [found[i].child_thread_id for i in ids[:2]] == ["thr_0", "thr_existing"]
        refused = found[ids[2]]
        assert refused.status == "failed" and "not for you" in (refused.result or {}).get("error", "")
        assert [found[i].child_thread_id for i in ids[3:]] == ["thr_3", "thr_4"]
