"""``tether demo``: two environments on loopback, the six probes local and remote.

It is the original bug report, replayed: for each probe, what did the parent receive —
the child's ``FINAL`` exactly once, as the task's result or as a follow-up?
"""

from __future__ import annotations

import json
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tether.launch import Server, follow_events
from tether.probes import finished, outcome, parent_script

PROBE_TIMEOUT = 60.0


def run_probe(
    origin: Server, child_env: Server, probe: int, where: str, seconds: float = 1.0
) -> dict[str, Any]:
    """Run one probe with its parent in ``origin`` and its child in ``child_env``."""
    environment = child_env.name if where == "remote" else None
    script = parent_script(probe, environment, seconds)
    with origin.client() as client:
        created = client.post(
            "/api/threads",
            json={"provider": "script", "title": f"probe {probe} ({where})", "message": json.dumps(script)},
        )
        created.raise_for_status()
        thread_id = created.json()["threadId"]

        def state() -> tuple[list[dict[str, Any]], dict[str, Any]]:
            tasks = client.get("/api/tasks", params={"parentThreadId": thread_id}).json()["tasks"]
            return tasks, client.get(f"/api/threads/{thread_id}").json()

        def check() -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
            tasks, parent = state()
            return (tasks, parent) if finished(tasks, parent) else None

        follow_events(origin.url, origin.token, check, PROBE_TIMEOUT)
        tasks, parent = state()
    child_runs: list[dict[str, Any]] = []
    if tasks:
        with (child_env if where == "remote" else origin).client() as client:
            child = client.get(f"/api/threads/{tasks[0]['childThreadId']}")
            if child.status_code == 200:
                child_runs = child.json()["runs"]
    return outcome(probe, where, tasks, parent, child_runs)


def link(origin: Server, peer: Server) -> bool:
    """Link ``origin`` to ``peer`` with a token minted by the peer; False if unsupported."""
    with peer.client() as client:
        minted = client.post("/api/link-tokens", json={"label": f"demo {origin.name}"})
        if minted.status_code == 404:
            return False
        minted.raise_for_status()
    with origin.client() as client:
        linked = client.post("/api/links", json={"url": peer.url, "token": minted.json()["token"]})
        linked.raise_for_status()
    return True


def run_demo(data: Path | None, probes: list[int], log: Console) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="tether-demo-") as scratch:
        root = Path(data) if data else Path(scratch)
        origin = Server(root / "origin", "origin")
        peer = Server(root / "peer", "peer")
        try:
            with log.status("starting two environments on loopback…"):
                origin.start()
                peer.start()
                remote = link(origin, peer)
            log.print(f"origin {origin.url} · peer {peer.url}" + ("" if remote else " (not linked)"))
            jobs = [(p, "local") for p in probes] + ([(p, "remote") for p in probes] if remote else [])
            with log.status(f"running {len(jobs)} probes…"), ThreadPoolExecutor(len(jobs)) as pool:
                futures = [pool.submit(run_probe, origin, peer, p, where) for p, where in jobs]
                rows = [future.result() for future in futures]
        finally:
            origin.stop()
            peer.stop()
    return rows


def print_table(rows: list[dict[str, Any]], console: Console) -> None:
    table = Table(
        "probe",
        "where",
        "result",
        "follow-ups",
        "wakes",
        "FINAL delivered",
        "latency ms",
        title="what the parent received",
    )
    for row in rows:
        ok = "[green]once ✓[/green]" if row["delivered"] else f"[red]{row['finalCount']}x ✗[/red]"
        table.add_row(
            str(row["probe"]),
            row["where"],
            str(row["result"]),
            ", ".join(str(f) for f in row["followUps"]) or "—",
            str(row["wakes"]),
            f"{ok} as {row['deliveredAs']}",
            "" if row["latencyMs"] is None else f"{row['latencyMs']:.0f}",
        )
    console.print(table)
