"""G7 for messages: a ``thread_send`` to a remote child made while the link is black is kept
by the origin and flows, exactly once, when the link heals — the parent's run is not failed
and nobody has to send it again."""

from __future__ import annotations

import time
from typing import Any

from blackhole import BlackholeProxy
from linkkit import assert_delivered_once, await_delivered, await_finished

from kit import env_id, link, link_status, new_thread, start_all, thread, wait_settled

#: SPEC G7 says 2 s from healing to delivery; a generous bound for a loaded 2-core machine.
HEAL_BOUND_SECONDS = 5.0

CHILD = {"tether_script": 1, "rules": [
    {"on": "start", "do": [{"reply": "READY"}]},
    {"on": "message", "do": [{"reply": "FINAL"}]},
]}


def parent_script(send_in_ms: int) -> dict[str, Any]:
    """Delegate, then — on a held scheduled wake, while the link is black — send to the child."""
    return {"tether_script": 1, "rules": [
        {"on": "start", "do": [
            {"delegate": {"task": CHILD, "environment": "peer", "id": "c"}},
            {"schedule": {"in_ms": send_in_ms, "text": "send now", "hold": True}},
            {"reply": "delegated"}]},
        {"on": "scheduled", "do": [
            {"thread_send": {"thread": "child:c", "text": "go on"}}, {"reply": "sent"}]},
        {"on": "delegated_task", "repeat": True, "do": [{"reply": "got {{text}}"}]},
    ]}


def test_a_send_made_during_a_partition_flows_once_after_it_heals(servers: Any) -> None:
    origin, peer = servers("origin"), servers("peer")
    start_all([origin, peer])
    proxy = BlackholeProxy(peer.port).start()
    try:
        link(origin, peer, url=proxy.url)
        parent_id = new_thread(origin, parent_script(send_in_ms=2500), "send while black")
        tasks, _ = await_delivered(origin, parent_id, 1)  # READY arrived: the root task is done
        assert tasks[0]["result"]["text"] == "READY"

        proxy.black()
        link_status(origin, env_id(peer), lambda e: e["status"] != "ok", 10, "the link to be down")
        wait_settled(origin, parent_id)  # the scheduled run sent (pending) and ended
        parent = thread(origin, parent_id)
        scheduled = [r for r in parent["runs"] if r["trigger"]["kind"] == "scheduled"]
        assert [r["status"] for r in scheduled] == ["completed"], parent["runs"]

        proxy.heal()
        healed = time.monotonic()
        tasks, parent = await_finished(origin, parent_id)
        took = time.monotonic() - healed
        assert_delivered_once(tasks, parent)
        follow_up = next(t for t in tasks if t["followUpOf"])
        assert follow_up["result"]["text"] == "FINAL"
        assert took < HEAL_BOUND_SECONDS, f"FINAL took {took:.1f}s after healing"
    finally:
        proxy.close()
