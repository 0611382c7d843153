"""Chaos on PostgreSQL (SPEC §12, G1 G3 G6): three ``tether serve`` processes serve one
environment on one database while parents, made through any of them, wait on local children
whose background commands end at random times. Processes are SIGKILLed at random moments (a
random one of those running a turn or a command then): each victim but the last is restarted
on its own data directory (it recovers its own work at start), the last stays dead, so its
lease (``TETHER_LEASE_SECONDS``) runs out and a survivor takes its work over. Then: every
answer reached its parent exactly once (the bookkeeping of ``test_chaos``), no run is left
queued or running anywhere, every interrupted run is reported in exactly one ``restart``
notice taken up by exactly one ``restart`` run, and the dead process is forgotten.

The draws come from the session seed (``TETHER_STRESS_SEED``); the test repeats with
``ROUNDS`` derived seeds (more with ``TETHER_STRESS=full``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import Counter
from typing import Any

import psycopg
import pytest

from kit import leftover_wrappers, new_thread, start_all

from .stresskit import FULL, Pulse, check_exactly_once, note, rng_for
from .test_chaos import _hits, _lose_commands, _quiet, parent_script

if FULL:
    ROUNDS, PARENTS, PER_PARENT, KILLS, LATE_TASKS = 3, 24, 8, 6, 4
    SETTLE_TIMEOUT = 600.0
else:
    ROUNDS, PARENTS, PER_PARENT, KILLS, LATE_TASKS = 1, 6, 4, 3, 3
    SETTLE_TIMEOUT = 180.0
GAP = (0.3, 2.0)  # between one restart and the next kill
DOWN = (0.0, 1.0)  # how long a restarted process stays down
#: Short, so the process left dead is taken over soon; long enough that a live process on
#: a loaded machine keeps its lease.
LEASE = "4"


def _member(server: Any) -> str:
    return (server.data / "member.id").read_text().strip()


def _busy(url: str, servers: list[Any]) -> list[Any]:
    """The processes running a turn or a command right now (a kill there hits something)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT data::json->>'member' FROM runs WHERE status = 'running' UNION "
            "SELECT data::json->>'member' FROM items WHERE status = 'running' AND kind = 'command'"
        ).fetchall()
    members = {row[0] for row in rows}
    return [s for s in servers if _member(s) in members]


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_chaos_on_three_processes_loses_and_duplicates_nothing(
    servers: Any, subreaper: Any, pg_cluster: Any, round_: int
) -> None:
    rng = rng_for(f"chaos-postgresql-{round_}")
    url = pg_cluster.database()
    trio = [servers(name, {"TETHER_STORE": url, "TETHER_LEASE_SECONDS": LEASE}) for name in ("a", "b", "c")]
    start_all(trio)
    parents: dict[str, int] = {}
    for n in range(PARENTS):
        made = new_thread(trio[n % 3], parent_script(rng, f"p{n}", PER_PARENT, local=True), f"p{n}")
        parents[made] = PER_PARENT

    alive, timeline, dead = list(trio), [], None
    for k in range(KILLS):
        time.sleep(rng.uniform(*GAP))  # the chaos: a random moment (not synchronisation)
        victim = rng.choice(_busy(url, alive) or alive)
        victim.kill()
        if k < KILLS - 1:
            lost = _lose_commands(rng, [victim])
            time.sleep(rng.uniform(*DOWN))  # the chaos: a random downtime
            victim.start()
            timeline.append(f"{victim.name} restarted ({lost} commands lost)")
        else:
            alive.remove(victim)
            dead = victim
            for pid in leftover_wrappers(victim.data):  # its machine is gone: its commands too
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            timeline.append(f"{victim.name} left dead")
        subreaper({s.process.pid for s in alive if s.process})
        late = parent_script(rng, f"late{k}", LATE_TASKS, local=True)  # races the next kill
        parents[new_thread(rng.choice(alive), late, f"late{k}")] = LATE_TASKS
    note(f"chaos-postgresql[{round_}]: {', '.join(timeline)}")

    reader = alive[0]
    with Pulse(alive) as pulse:
        pulse.wait_for(lambda: _quiet(reader, reader, set(parents)), SETTLE_TIMEOUT,
                       "every parent settled and every task terminal and delivered")
    subreaper({s.process.pid for s in alive if s.process})

    views = {p: reader.get(f"/api/threads/{p}") for p in parents}
    tasks = [t for t in reader.get("/api/tasks")["tasks"] if t["parentThreadId"] in parents]
    expected = {p: n for p, n in parents.items() if views[p]["runs"][0]["status"] == "completed"}
    problems = check_exactly_once(views, tasks, expected)
    every = [reader.get(f"/api/threads/{t['threadId']}") for t in reader.get("/api/threads")["threads"]]
    problems += [p for view in every for p in _restart_problems(view)]
    with psycopg.connect(url) as conn:
        members = {row[0] for row in conn.execute("SELECT id FROM members")}
    if dead is not None and _member(dead) in members:
        problems.append(f"{dead.name} is dead but still a member")
    note(f"chaos-postgresql[{round_}]: {len(tasks)} tasks, {len(every)} threads; "
         f"hits: {_hits(reader, reader, tasks)}; {len(problems)} problems")
    assert not problems, "\n".join(problems[:60])


def _restart_problems(view: dict[str, Any]) -> list[str]:
    """No run left queued or running; each interrupted run named by exactly one ``restart``
    notice, and each such notice taken up by exactly one ``restart`` run."""
    tid = view["threadId"]
    problems = [f"{tid}: run {r['runId']} still {r['status']}" for r in view["runs"]
                if r["status"] in ("queued", "running")]
    notices = [m for m in view["messages"]
               if m["role"] == "notification" and (m["source"] or {}).get("kind") == "restart"]
    for run in (r for r in view["runs"] if r["status"] == "interrupted"):
        named = sum(1 for m in notices if run["runId"] in m["text"])
        if named != 1:
            problems.append(f"{tid}: interrupted run {run['runId']} named in {named} restart notices")
    restarts = [r for r in view["runs"] if r["trigger"]["kind"] == "restart"]
    taken: Counter[str] = Counter(m for r in restarts for m in r["trigger"].get("messageIds", []))
    for notice in notices:
        if taken[notice["messageId"]] != 1:
            problems.append(f"{tid}: restart notice {notice['messageId']} taken up by "
                            f"{taken[notice['messageId']]} restart runs")
    return problems
