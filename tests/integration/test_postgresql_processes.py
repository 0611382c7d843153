"""Several ``tether serve`` processes on one PostgreSQL database are one environment
(SPEC §12): any of them answers for every thread, waits and the event feed included, work
is claimed by whichever process is free, and a process killed with SIGKILL is recovered by
the survivors as a restart would (G6) — every answer still reaches its parent exactly once.

The probe checks are ``test_probes``' own, collected here with this module's ``probes``:
each parent is made through one process and awaited and read through the other.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kit import finals, runs_of, shutdown, wake_messages
from tether.launch import Server

from .helpers import (
    await_threads,
    new_thread,
    noting_parent,
    reply,
    rule,
    script,
    settled_tree,
    tasks_of,
    thread,
)
from .test_probes import (  # noqa: F401  (collected here: the same checks, two processes)
    drive,
    test_final_delivered_exactly_once,
    test_interim_and_progress_are_never_answers,
    test_probe_children_are_the_spec_scripts,
    test_progress_runs_land_in_progress_only,
)

#: Seconds a process may be silent before the others recover it (short, for the tests).
LEASE = "2"


def processes(root: Path, url: str, *names: str, env: dict[str, str] | None = None) -> list[Server]:
    """Started ``tether serve`` processes, one data directory each, all on ``url`` (``env``
    adds settings)."""
    env = {"TETHER_STORE": url, "TETHER_LEASE_SECONDS": LEASE, **(env or {})}
    return [Server(root / name, name, env=env).start() for name in names]


def member(server: Server) -> str:
    return (server.data / "member.id").read_text().strip()


def run_members(url: str, thread_id: str) -> dict[str, str | None]:
    """Which process ran each run of ``thread_id`` (not part of the API: read the store)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, data::json->>'member' FROM runs WHERE thread_id = %s", (thread_id,))
        return dict(rows.fetchall())


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, pg_cluster: Any) -> Iterator[list[Server]]:
    servers = processes(tmp_path_factory.mktemp("pair"), pg_cluster.database(), "a", "b")
    yield servers
    shutdown(servers, graceful=True)


@pytest.fixture(scope="module")
def probes(pair: list[Server]) -> dict[int, dict[str, Any]]:
    """The six probes at once; odd ones made through a and awaited through b, even ones
    the other way round."""
    a, b = pair
    with ThreadPoolExecutor(6) as pool:
        futures = {
            probe: pool.submit(drive, a if probe % 2 else b, probe, b if probe % 2 else a)
            for probe in range(1, 7)
        }
        return {probe: future.result() for probe, future in futures.items()}


def test_the_processes_are_one_environment(pair: list[Server]) -> None:
    a, b = pair
    assert a.token == b.token, "every process writes the environment's admin token"
    healths = []
    for server in pair:
        with server.client() as client:
            healths.append(client.get("/api/health").json()["environmentId"])
    assert healths[0] == healths[1]
    assert member(a) != member(b)


def test_a_wait_on_one_process_ends_with_work_done_on_another(pair: list[Server]) -> None:
    """The doorbell: b's waiter is woken by what a (or b) commits, not by a timeout."""
    a, b = pair
    with a.client() as made, b.client() as watching:
        parent_id = new_thread(made, noting_parent(script(rule("start", reply("FINAL")))))
        settled_tree(watching, parent_id)
        [wake] = wake_messages(thread(watching, parent_id))
        assert "FINAL" in wake["text"]


@pytest.fixture
def killed(tmp_path: Path, pg_cluster: Any) -> Iterator[dict[str, Any]]:
    """Two processes; a child busy in its turn with an awaited command, and parents with
    quick children in flight, when the process running the busy child is SIGKILLed."""
    url = pg_cluster.database()
    servers = processes(tmp_path, url, "a", "b")
    try:
        busy_child = script(
            rule(
                "start",
                {"bash": "sleep 600", "background": True, "await": True, "id": "b1"},
                reply("STARTED"),
                {"sleep_ms": 600_000},
            ),
            rule("restart", reply("FINAL")),
            rule("background_command", reply("NOT THIS")),
        )
        quick_child = script(
            rule("start", {"sleep_ms": 1500}, reply("FINAL")), rule("restart", reply("FINAL"))
        )
        with servers[0].client() as client:
            busy = new_thread(client, noting_parent(busy_child))
            await_threads(
                servers[0],
                lambda: any(
                    m["text"] == "STARTED"
                    for t in tasks_of(client, busy)
                    for m in thread(client, t["childThreadId"])["messages"]
                ),
                {busy, *(t["childThreadId"] for t in tasks_of(client, busy))},
                what="the busy child in its turn",
            )
            child = tasks_of(client, busy)[0]["childThreadId"]
            quick = [new_thread(client, noting_parent(quick_child)) for _ in range(4)]
            for parent_id in quick:  # delegated, the children in their turns somewhere
                await_threads(servers[0], lambda p=parent_id: tasks_of(client, p), {parent_id})
        [ran] = {m for m in run_members(url, child).values() if m}
        victim = next(s for s in servers if member(s) == ran)
        survivor = next(s for s in servers if s is not victim)
        victim.kill()
        yield {"url": url, "survivor": survivor, "busy": busy, "child": child, "quick": quick, "victim": ran}
    finally:
        shutdown(servers, graceful=True)


def test_a_killed_process_is_recovered_by_the_survivor_and_answers_arrive_once(
    killed: dict[str, Any],
) -> None:
    survivor: Server = killed["survivor"]
    with survivor.client() as client:
        for parent_id in (killed["busy"], *killed["quick"]):
            settled_tree(client, parent_id)
            parent = thread(client, parent_id)
            assert list(finals(parent).values()) == [1], parent["messages"]
            [task] = tasks_of(client, parent_id)
            assert task["status"] == "completed" and task["result"]["text"] == "FINAL"
            assert len(wake_messages(parent)) == 1
        child = thread(client, killed["child"])
    first = child["runs"][0]
    assert first["status"] == "interrupted", "the killed process's turn was interrupted"
    [item] = child["background"]
    assert item["status"] == "failed", "its command was reported gone"
    [restart] = runs_of(child, "restart")
    assert restart["status"] == "completed" and restart["reply"] == "FINAL"
    members = run_members(killed["url"], killed["child"])
    assert members[restart["runId"]] == member(survivor), "the survivor ran the restart"
    with psycopg.connect(killed["url"]) as conn:
        left = conn.execute("SELECT id FROM members").fetchall()
    assert (killed["victim"],) not in left, "the gone process was forgotten"
