"""Partition (SPEC §9, G7): the origin reaches its peer through a proxy that blackholes the
link mid-run — no bytes either way, connections accepted but never answered, as a dead
route looks to both ends. Meanwhile the remote children finish their background work and
answer, and more tasks are delegated. Once the link heals, everything reaches the parents
exactly once, within 2 s, without anyone doing anything.

The delay is measured from the servers' own records: for each task, from the moment the
proxy heals to the ``startedAt`` of the parent's wake run that carries the task. Small
runs blackhole for 5 s and assert a generous bound (a loaded 2-core CI machine); the full
run blackholes for 60 s and asserts the SPEC's 2 s.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from integration.links.blackhole import BlackholeProxy
from kit import link, new_thread, start_all, wake_entries, wake_messages
from tether.ids import parse_time

from .stresskit import FULL, Pulse, check_exactly_once, note, rng_for

if FULL:
    BLACK_SECONDS, HEAL_BOUND = 60.0, 2.0
    PARENTS, PER_PARENT = 20, 5  # delegated before the blackhole: 100 tasks
    LATE_PARENTS, LATE_PER_PARENT = 10, 2  # delegated during it: 20 more
    WORK = (0.5, 20.0)  # how long the children's background work takes (it ends while black)
else:
    BLACK_SECONDS, HEAL_BOUND = 5.0, 5.0
    PARENTS, PER_PARENT = 4, 4
    LATE_PARENTS, LATE_PER_PARENT = 2, 2
    WORK = (1.0, 3.5)


def child(rng: Any, kind: int) -> dict[str, Any]:
    """Background work ending while the link is black: an awaited command (FINAL is the
    result), a command not awaited (WAITING is the result, FINAL a follow-up), or a held
    scheduled wake (FINAL is the result)."""
    seconds = rng.uniform(*WORK)
    final = [{"reply": "FINAL"}]
    if kind == 2:
        return {"tether_script": 1, "rules": [
            {"on": "start", "do": [{"schedule": {"in_ms": int(seconds * 1000), "text": "now", "hold": True}},
                                   {"reply": "WAITING"}]},
            {"on": "scheduled", "do": final}]}
    return {"tether_script": 1, "rules": [
        {"on": "start", "do": [{"bash": f"sleep {seconds:.2f}; echo OK", "background": True, "id": "b1",
                                "await": kind == 0}, {"reply": "WAITING"}]},
        {"on": "background_command", "do": final}]}


def parent(children: list[dict[str, Any]], name: str) -> dict[str, Any]:
    delegates = [{"delegate": {"task": c, "id": f"c{n}", "title": f"{name}.{n}", "environment": "peer"}}
                 for n, c in enumerate(children)]
    return {"tether_script": 1, "rules": [
        {"on": "start", "do": [*delegates, {"reply": "delegated"}]},
        {"on": "delegated_task", "repeat": True, "do": [{"reply": "got it"}]}]}


@pytest.fixture
def partitioned(servers: Any) -> Iterator[dict[str, Any]]:
    origin, peer = servers("origin"), servers("peer")
    start_all([origin, peer])
    proxy = BlackholeProxy(peer.port).start()
    try:
        link(origin, peer, url=proxy.url)
        yield {"origin": origin, "peer": peer, "proxy": proxy}
    finally:
        proxy.close()


def test_a_healed_partition_delivers_everything_once_within_2s(partitioned: dict[str, Any]) -> None:
    origin, peer, proxy = partitioned["origin"], partitioned["peer"], partitioned["proxy"]
    rng = rng_for("partition")
    parents: dict[str, int] = {}
    for p in range(PARENTS):
        kids = [child(rng, (p + n) % 3) for n in range(PER_PARENT)]
        parents[new_thread(origin, parent(kids, f"p{p}"), f"p{p}")] = PER_PARENT

    with Pulse([origin, peer]) as pulse:
        # every child has answered its first run (the origin knows it): the work is under way
        pulse.wait_for(lambda: _first_answers_known(origin, set(parents), PARENTS * PER_PARENT), 60,
                       "every remote child to start its background work")

        proxy.black()
        black_at = time.monotonic()
        # answers that reached the origin before the blackhole (short work) do not count
        before = {t["taskId"] for t in origin.get("/api/tasks")["tasks"]
                  if (t["result"] or {}).get("text") == "FINAL"}
        late = {}
        for p in range(LATE_PARENTS):  # delegated while the link is black: pushed after it heals
            kids = [{"tether_script": 1, "rules": [{"on": "start", "do": [{"reply": "FINAL"}]}]}
                    for _ in range(LATE_PER_PARENT)]
            late[new_thread(origin, parent(kids, f"late{p}"), f"late{p}")] = LATE_PER_PARENT
        parents.update(late)

        # the children answer on the peer while the link is black
        pulse.wait_for(lambda: _all_answered_on_peer(peer, set(parents) - set(late), PARENTS * PER_PARENT),
                       BLACK_SECONDS + 30, "every remote child to answer FINAL on the peer")
        # the rest of the partition: its length is the experiment, not a synchronisation
        time.sleep(max(0.0, BLACK_SECONDS - (time.monotonic() - black_at)))
        black_for = time.monotonic() - black_at
        leaked = [task_id for p in parents for m in wake_messages(origin.get(f"/api/threads/{p}"))
                  for task_id, text in wake_entries(m["text"]) if text == "FINAL" and task_id not in before]
        assert not leaked, f"FINAL crossed the blackhole for {leaked}"
        assert not [t for p in late for t in origin.get("/api/tasks", parentThreadId=p)["tasks"]
                    if t["childThreadId"]], "a delegation crossed the blackhole"

        proxy.heal()
        healed, healed_mono = datetime.now(UTC), time.monotonic()
        tasks = pulse.wait_for(lambda: _delivered(origin, parents), 60,
                               "every task delivered after the link healed")
        seen_after = time.monotonic() - healed_mono

    views = {p: origin.get(f"/api/threads/{p}") for p in parents}
    problems = check_exactly_once(views, tasks, parents)
    assert not problems, "\n".join(problems[:60])

    # how late each answer given during the partition woke its parent, from the servers' own
    # timestamps (the WAITING results were delivered before the blackhole)
    delays = []
    answers = [t for t in tasks if (t["result"] or {}).get("text") == "FINAL" and t["taskId"] not in before]
    for task in answers:
        wake_run = next(r for r in views[task["parentThreadId"]]["runs"]
                        if r["runId"] == task["delivery"]["wakeRunId"])
        delays.append(((parse_time(wake_run["startedAt"]) - healed).total_seconds(), task["taskId"]))
    worst, worst_task = max(delays)
    delays.sort()
    median = delays[len(delays) // 2][0]
    delegated_late = {t["taskId"] for t in tasks if t["parentThreadId"] in late}
    worst_late = max((d for d, t in delays if t in delegated_late), default=float("nan"))
    worst_answered = max((d for d, t in delays if t not in delegated_late), default=float("nan"))
    note(f"partition: {len(tasks)} tasks ({len(delays)} answered during the partition) across a "
         f"{black_for:.0f}s blackhole; after healing the last "
         f"wake started in {worst:.2f}s (median {median:.2f}s; the test saw it all in {seen_after:.2f}s); "
         f"bound {HEAL_BOUND:.0f}s; answered during the partition: last {worst_answered:.2f}s, "
         f"delegated during it: last {worst_late:.2f}s")
    assert worst <= HEAL_BOUND, f"{worst_task} woke its parent {worst:.2f}s after the link healed"


def _first_answers_known(origin: Any, parents: set[str], count: int) -> bool:
    tasks = [t for t in origin.get("/api/tasks")["tasks"] if t["parentThreadId"] in parents]
    roots = [t for t in tasks if not t["followUpOf"]]
    return len(roots) >= count and all(
        t["status"] == "completed" or t["workState"] == "waiting_background" for t in roots)


def _all_answered_on_peer(peer: Any, parents: set[str], count: int) -> bool:
    """On the peer: every child settled and its chain's last answer is FINAL."""
    tasks = [t for t in peer.get("/api/tasks")["tasks"] if t["parentThreadId"] in parents]
    if len([t for t in tasks if not t["followUpOf"]]) < count:
        return False
    if any(t["status"] in ("queued", "running") for t in tasks):
        return False
    chains: dict[str, bool] = {}
    for task in tasks:
        root = task["followUpOf"] or task["taskId"]
        chains[root] = chains.get(root, False) or (task["result"] or {}).get("text") == "FINAL"
    return all(chains.values())


def _delivered(origin: Any, parents: dict[str, int]) -> list[dict[str, Any]] | None:
    tasks = [t for t in origin.get("/api/tasks")["tasks"] if t["parentThreadId"] in parents]
    if len([t for t in tasks if not t["followUpOf"]]) < sum(parents.values()):
        return None
    if any(t["status"] in ("queued", "running") or t["delivery"]["state"] != "acknowledged" for t in tasks):
        return None
    chains: dict[str, bool] = {}
    for task in tasks:
        root = task["followUpOf"] or task["taskId"]
        chains[root] = chains.get(root, False) or (task["result"] or {}).get("text") == "FINAL"
    if not all(chains.values()):
        return None
    if not all(t["settled"] for t in origin.get("/api/threads")["threads"] if t["threadId"] in parents):
        return None
    return tasks
