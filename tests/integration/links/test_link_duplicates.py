"""G3 across a link: the destination's events delivered twice wake the parent once.

Done for real: after remote probes complete, the origin is stopped, its stored cursor for
the link is rewound to the start, and on restart it reads the whole feed again. Nothing the
parents received may change."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from linkkit import EXPECTED_AS, assert_delivered_once, read_link_row, run_probes

from kit import env_id, link, poll, start_all, tasks_of, thread, wait_settled

PROBES = [1, 2, 3, 4, 5, 6]


def _rewind(db: Path, environment_id: str) -> None:
    with sqlite3.connect(db, timeout=5) as conn:
        query = "SELECT data FROM links WHERE environment_id = ?"
        (data,) = conn.execute(query, (environment_id,)).fetchone()
        record = json.loads(data)
        assert "cursor" in record, record
        record["cursor"] = "0"
        update = "UPDATE links SET data = ? WHERE environment_id = ?"
        conn.execute(update, (json.dumps(record), environment_id))
    conn.close()


def _received(origin: Any, parent_id: str) -> dict[str, Any]:
    """Everything a parent received: its runs, its messages, its tasks' deliveries."""
    parent = thread(origin, parent_id)
    return {
        "runs": [(r["runId"], r["status"], r["trigger"]["kind"], r["reply"]) for r in parent["runs"]],
        "messages": [(m["messageId"], m["role"], m["text"]) for m in parent["messages"]],
        "tasks": [(t["taskId"], t["status"], t["result"], t["delivery"], t["followUpOf"])
                  for t in tasks_of(origin, parent_id)],
    }


def test_a_replayed_feed_wakes_nobody_twice(servers: Any) -> None:
    origin, peer = servers("origin"), servers("peer")
    start_all([origin, peer])
    link(origin, peer)
    peer_id = env_id(peer)
    rows = run_probes([(origin, peer, p, "remote") for p in PROBES], seconds=0.5)
    for row in rows:
        assert row["outcome"]["delivered"], row["outcome"]
        assert row["outcome"]["deliveredAs"] == EXPECTED_AS[row["outcome"]["probe"]]
    before = {row["parentId"]: _received(origin, row["parentId"]) for row in rows}

    origin.stop()
    db = origin.data / "tether.db"
    cursor = read_link_row(db, peer_id)["cursor"]
    assert cursor is not None and int(cursor) > 0
    _rewind(db, peer_id)
    assert read_link_row(db, peer_id)["cursor"] == "0"
    origin.start()

    # applying an event moves the stored cursor in the same transaction, and no event says
    # so: poll the origin's store (read-only) until the whole feed has been read again
    poll(lambda: int(read_link_row(db, peer_id)["cursor"] or 0) >= int(cursor), 30,
         f"the origin to read the feed again up to {cursor}")

    for parent_id, received in before.items():
        wait_settled(origin, parent_id)
        assert _received(origin, parent_id) == received
        tasks = tasks_of(origin, parent_id)
        assert_delivered_once(tasks, thread(origin, parent_id))
