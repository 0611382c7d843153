"""G7: a partition between origin and destination. The children answer while the link is
black; once it heals everything reaches the parents exactly once, promptly, without user
action — and meanwhile the origin shows the link as not ok, with its last error."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from blackhole import BlackholeProxy
from linkkit import assert_delivered_once, await_finished, await_on, final_count

from kit import env_id, link, link_status, new_thread, start_all, tasks_of, thread
from tether.ids import parse_time
from tether.launch import Server, follow_events
from tether.probes import parent_script

#: How long the link stays black (the stress suite's is 60 s; the behaviour is the same).
BLACKHOLE_SECONDS = 8.0
#: How long the children's background work takes: it ends while the link is black.
CHILD_SECONDS = 3.0
#: SPEC G7 says 2 s from healing to delivery; a generous bound for a loaded 2-core machine.
HEAL_BOUND_SECONDS = 5.0
PROBES = [1, 2, 3, 4, 6]


@pytest.fixture
def partitioned(servers: Any) -> Iterator[dict[str, Any]]:
    origin, peer = servers("origin"), servers("peer")
    start_all([origin, peer])
    proxy = BlackholeProxy(peer.port).start()
    try:
        link(origin, peer, url=proxy.url)
        yield {"origin": origin, "peer": peer, "proxy": proxy, "peerId": env_id(peer)}
    finally:
        proxy.close()


def _child_of(origin: Server, parent_id: str) -> str:
    def known() -> str | None:
        tasks = tasks_of(origin, parent_id)
        return (tasks[0]["childThreadId"] or None) if tasks else None

    return str(await_on(origin, known, 30, f"the peer to accept the task of {parent_id}"))


def _final_on_peer(peer: Server, child_id: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        view = thread(peer, child_id)
        answered = any(r["reply"] == "FINAL" and r["status"] == "completed" for r in view["runs"])
        return view if answered and view["settled"] else None

    return await_on(peer, check, 30, f"child {child_id} to answer FINAL")


def test_everything_flows_once_after_a_partition_heals(partitioned: dict[str, Any]) -> None:
    origin, peer, proxy, peer_id = (partitioned[k] for k in ("origin", "peer", "proxy", "peerId"))
    parents = {p: new_thread(origin, parent_script(p, "peer", CHILD_SECONDS), f"probe {p}") for p in PROBES}
    children = {p: _child_of(origin, parent_id) for p, parent_id in parents.items()}

    proxy.black()
    black_at = time.monotonic()

    entry = link_status(origin, peer_id, lambda e: e["status"] != "ok" and bool(e["lastError"]), 10,
                        "the origin to show the link as not ok")
    assert entry["status"] in ("unreachable", "error"), entry

    # the children answer while the link is black (watched on the peer itself)
    for child_id in children.values():
        _final_on_peer(peer, child_id)

    # for the rest of the blackhole nothing may reach the parents
    def leaked() -> list[str]:
        return [pid for pid in parents.values() if final_count(thread(origin, pid))]

    remaining = BLACKHOLE_SECONDS - (time.monotonic() - black_at)
    crossed = follow_events(origin.url, origin.token, leaked, max(remaining, 0.1))
    assert not crossed, f"FINAL reached {crossed} through the blackhole"
    assert link_status(origin, peer_id, lambda e: e["status"] != "ok", 1, "the link to be still down")

    proxy.heal()
    healed = datetime.now(UTC)

    for probe, parent_id in parents.items():
        tasks, parent = await_finished(origin, parent_id, 30)
        assert_delivered_once(tasks, parent)
        carrier = next(t for t in tasks if (t["result"] or {}).get("text") == "FINAL")
        wake = next(r for r in parent["runs"] if r["runId"] == carrier["delivery"]["wakeRunId"])
        late = (parse_time(wake["startedAt"]) - healed).total_seconds()
        assert late < HEAL_BOUND_SECONDS, f"probe {probe}: FINAL woke the parent {late:.2f}s after healing"

    link_status(origin, peer_id, lambda e: e["status"] == "ok", 10, "the link to be ok again")
