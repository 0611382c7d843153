"""Many clients at once while tasks run (issue #9, SPEC §9 mixed load).

Two linked environments; parents on A delegate children to A and B, each child running a
monitor and an awaited background command. Meanwhile clients hammer both servers with
every kind of token — the admin, the link token A uses (the fence applies), a per-thread
credential (what a real agent's MCP calls carry) — reading, writing, following the SSE
feed, calling MCP tools and loading the web page.

What must hold: no 5xx and no broken connection; every child's FINAL reaches its parent
exactly once; every command and monitor ended by its own process (exit 0, never "watcher
failed"); and no traceback in either server's log. Before the store had one owner, the
link-token and credential reads ran in the thread pool on the engine's connection and
this failed with hundreds of 500s, monitors ended as failed, and a lost answer.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from kit import link, new_thread, poll, start_all

from .load import Client, Record, run_load
from .stresskit import FULL, SEED, Pulse, check_exactly_once, note, rng_for, wait_idle

PARENTS, CHILDREN, CLIENTS, SECONDS = (8, 10, 4, 60.0) if FULL else (3, 2, 2, 20.0)

MONITOR = "for i in 1 2 3 4; do echo line $i; sleep 0.4; done"


def child_script(seconds: float) -> dict[str, Any]:
    return {"tether_script": 1, "rules": [
        {"on": "start", "do": [
            {"monitor": MONITOR, "id": "m1"},
            {"bash": f"sleep {seconds:.2f}; echo OK", "background": True, "id": "b1", "await": True},
            {"reply": "WAITING"}]},
        {"on": "monitor_event", "repeat": True, "do": [{"reply": "PROGRESS"}]},
        {"on": "monitor_finished", "do": [{"reply": "FINAL"}]},
        {"on": "background_command", "do": [{"reply": "FINAL"}]},
    ]}


def parent_script(rng: Any, peer: str) -> dict[str, Any]:
    delegates = [
        {"delegate": {"task": child_script(rng.uniform(0.5, 3.0)), "title": f"child {n}",
                      **({"environment": peer} if n % 2 else {})}}
        for n in range(CHILDREN)
    ]
    return {"tether_script": 1, "rules": [
        {"on": "start", "do": [*delegates, {"reply": "delegated"}]},
        {"on": "delegated_task", "repeat": True, "do": [{"reply": "noted"}]},
    ]}


def test_many_clients_with_every_kind_of_token_while_tasks_run(servers: Any) -> None:
    a, b = servers("a"), servers("b")
    start_all([a, b])
    linked = link(a, b)
    rng = rng_for("load")
    watcher = new_thread(a, parent_script(rng, "b"), "watched parent")
    with a.client() as client:
        credential = client.post(f"/api/threads/{watcher}/credentials", json={}).json()["token"]
    clients = [
        *[Client(f"admin-a{n}", a.url, a.token, watcher, web=True) for n in range(CLIENTS)],
        *[Client(f"admin-b{n}", b.url, b.token) for n in range(CLIENTS // 2)],
        *[Client(f"link-b{n}", b.url, linked["token"]) for n in range(CLIENTS)],
        *[Client(f"credential-a{n}", a.url, credential, watcher, writes=False) for n in range(CLIENTS)],
    ]
    stop, record = threading.Event(), Record()
    loader = threading.Thread(target=run_load, args=(clients, stop, SECONDS * 4, SEED, record))
    loader.start()
    try:
        # The load runs before, while and after the tasks run: every client is in it.
        poll(lambda: all(record.per_client[c.name] >= 3 for c in clients), SECONDS, "every client answered")
        parents = [watcher, *(new_thread(a, parent_script(rng, "b"), f"parent {n}") for n in range(PARENTS))]
        with Pulse([a, b]) as pulse:
            try:
                pulse.wait_for(lambda: all(_settled(a, p) for p in parents), SECONDS * 3, "all settled")
            except AssertionError as error:
                raise AssertionError(f"{error}: {_unsettled(a, parents)}") from None
        floor = {c.name: record.per_client[c.name] + 3 for c in clients}
        poll(lambda: all(record.per_client[n] >= m for n, m in floor.items()), SECONDS, "load afterwards")
    finally:
        stop.set()
        loader.join()
    note(f"load: {record.requests} requests from {len(clients)} clients, statuses {dict(record.statuses)}")
    assert record.failures == [], record.failures[:20]
    assert record.statuses.keys() <= {200, 201}, record.statuses

    for p in parents:
        wait_idle(a, p)
    views = {p: a.get(f"/api/threads/{p}") for p in parents}
    tasks = a.get("/api/tasks")["tasks"]
    problems = check_exactly_once(views, tasks, dict.fromkeys(parents, CHILDREN))
    assert problems == [], problems
    for server in (a, b):
        items = [i for t in server.get("/api/threads")["threads"]
                 for i in server.get(f"/api/threads/{t['threadId']}")["background"]
                 if i["kind"] in ("command", "monitor")]
        assert items and all(i["status"] == "ended" and i["exitCode"] == 0 for i in items), [
            i for i in items if i["status"] != "ended" or i["exitCode"] != 0]
        assert "Traceback" not in server.log_tail(), server.log_tail()[-3000:]


def _unsettled(server: Any, parents: list[str]) -> list[dict[str, Any]]:
    """What each parent that did not settle is still doing, and its tasks' states."""
    found = []
    for parent in parents:
        view = server.get(f"/api/threads/{parent}")
        if _settled(server, parent):
            continue
        tasks = Counter(f"{t['status']}/{t['delivery']['state']}" for t in view["tasks"])
        runs = Counter(r["status"] for r in view["runs"])
        found.append({"thread": parent, "attention": view["attention"], "runs": runs, "tasks": tasks})
    return found


def _settled(server: Any, thread_id: str) -> bool:
    view = server.get(f"/api/threads/{thread_id}")
    return bool(view["settled"]) and len([t for t in view["tasks"] if not t["followUpOf"]]) == CHILDREN
