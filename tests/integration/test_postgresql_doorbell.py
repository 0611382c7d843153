"""The doorbell (SPEC §12): a process learns of another's commit by ``LISTEN/NOTIFY``, not
by looking at the store again. Both processes here look only every ``POLL`` seconds
(``TETHER_POLL_SECONDS``) and the event feed's keepalive is as long, so an SSE event or a
wait on process b for a commit on process a arrives in time only if the doorbell rang.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kit import shutdown
from tether.launch import Server

from .helpers import reply, rule, script, sse_events, thread
from .test_postgresql_processes import processes

#: The fallback poll: far longer than any answer below may take.
POLL = 60.0
#: What "in time" means: a doorbell answers in milliseconds; this leaves room for a loaded box.
IN_TIME = 10.0


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, pg_cluster: Any) -> Iterator[list[Server]]:
    root, slow = tmp_path_factory.mktemp("bell"), {"TETHER_POLL_SECONDS": str(POLL)}
    servers = processes(root, pg_cluster.database(), "a", "b", env=slow)
    yield servers
    shutdown(servers, graceful=True)


def test_an_event_committed_on_a_reaches_a_feed_on_b_at_once(pair: list[Server]) -> None:
    a, b = pair
    made: dict[str, float] = {}

    def commit_on_a() -> None:
        with a.client() as client:
            created = client.post("/api/threads", json={"provider": "script", "message": "hello"})
        assert created.status_code == 201, created.text
        made["at"] = time.monotonic()

    try:
        events = sse_events(
            b.url, b.token, "now", lambda event: True, timeout=IN_TIME, on_open=commit_on_a, keepalive=POLL
        )
    except httpx.ReadTimeout:
        pytest.fail(f"b's feed showed nothing of a's commit within {IN_TIME}s")
    assert time.monotonic() - made["at"] < IN_TIME
    assert events and events[0]["threadId"] is not None


def test_a_wait_on_b_ends_at_once_when_a_commits(pair: list[Server]) -> None:
    """b waits for a thread to settle; the thread's scheduled wake fires on whichever process
    armed it (a, unless b's doorbell made it claim the timer) 2 s after it starts — long
    after b's wait is open."""
    a, b = pair
    held = script(
        rule("start", {"schedule": {"in_ms": 2000, "text": "time is up", "hold": True}}, reply("WAITING")),
        rule("scheduled", reply("DONE")),
    )
    with a.client() as client:
        created = client.post("/api/threads", json={"provider": "script", "message": json.dumps(held)})
        assert created.status_code == 201, created.text
        thread_id = created.json()["threadId"]
    with b.client(timeout=POLL) as client:
        asked = time.monotonic()
        answer = client.get(
            f"/api/threads/{thread_id}/wait",
            params={"untilSettled": "true", "timeoutMs": int(3 * IN_TIME * 1000)},
        ).json()
        waited = time.monotonic() - asked
        view = thread(client, thread_id)
    # A wait that times out looks once more (the store is the truth), so only the time tells.
    assert answer["settled"] and waited < IN_TIME, f"b heard of a's commit after {waited:.1f}s: {answer}"
    assert [run["reply"] for run in view["runs"]] == ["WAITING", "DONE"], view["runs"]
