"""The link's pusher is supervised: an answer it cannot read (a proxy's garbage, a bug in
a handler) is logged and retried, never the end of the pusher — else every remote task
created after it would stay ``pending`` for good (#9)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
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
    in_memory = functools.partial(httpx.AsyncClient, transport=httpx.MockTransport(peer))
    monkeypatch.setattr(httpx, "AsyncClient", in_memory)
    env = Environment(tmp_path / "origin", name="origin")
    with env.store.transaction() as tx:
        tx.put(Link(PEER, "peer", "http://127.0.0.1:9", "secret", "2026-01-01T00:00:00Z"))
    await env.start()
    yield env, peer
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
