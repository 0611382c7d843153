"""Chaos (SPEC §9, G1 G3 G5 G6): SIGKILL the origin and/or the peer at random moments while
many parents wait on children — half local, half remote — whose background commands end
at random times, restart them on the same data and ports, and every child's FINAL must
still reach its parent exactly once.

Each child starts ``sleep X; echo OK`` in the background (awaited for half of them, so
FINAL is the task's result; not awaited for the others, so WAITING is the result and FINAL
a follow-up) and answers FINAL when the command ends — or when it is restarted (G6: a run
running at the kill is interrupted and the thread gets a ``restart`` run; a command that
is gone is reported by a ``restart`` run). So a child may legitimately say FINAL more than
once (a restart run, then its adopted command's end): each answer is then its own task or
follow-up, and the rule checked is per task id: every task whose result is FINAL shows
FINAL in exactly one wake of its parent, every task is reported in exactly one wake, and
every delegated task's chain (it and its follow-ups) carries FINAL.

The kill times, victims, downtimes and the children's durations are drawn from a seeded
``random.Random``; the seed is printed in the summary, ``TETHER_STRESS_SEED`` replays it
(the draws, not the machine's timing).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import Counter
from typing import Any

import pytest

from kit import leftover_wrappers, link, new_thread, start_all

from .stresskit import FULL, Pulse, check_exactly_once, note, rng_for, wait_idle

if FULL:
    PARENTS, PER_PARENT = 46, 10  # 460 tasks up front ...
    KILLS, LATE_TASKS = 8, 5  # ... and a parent of 5 more after each restart: 500 in all
    SLEEP = (0.2, 8.0)  # how long each child's background command runs
    GAP = (0.3, 3.0)  # between one restart and the next kill
    DOWN = (0.0, 2.0)  # how long a killed server stays down
    TURN_MS = (0, 1500)  # how long a child's turn takes
    LOSE = 0.25  # the share of a killed server's commands that die with it
    SETTLE_TIMEOUT = 600.0
else:
    PARENTS, PER_PARENT = 8, 4  # 32 tasks up front ...
    KILLS, LATE_TASKS = 3, 4  # ... and 12 more during the chaos: 44
    SLEEP = (0.3, 4.0)
    GAP = (0.2, 1.5)
    DOWN = (0.0, 0.5)
    TURN_MS = (0, 2000)
    LOSE = 0.25
    SETTLE_TIMEOUT = 120.0


def child_script(rng: Any, awaited: bool) -> dict[str, Any]:
    """Its runs take a while (an agent's turn does), so that kills land inside them too."""
    seconds = rng.uniform(*SLEEP)
    return {"tether_script": 1, "rules": [
        {"on": "start", "do": [
            {"bash": f"sleep {seconds:.2f}; echo OK", "background": True, "id": "b1", "await": awaited},
            {"sleep_ms": rng.randrange(*TURN_MS)},
            {"reply": "WAITING"}]},
        {"on": "background_command", "do": [{"sleep_ms": rng.randrange(*TURN_MS)}, {"reply": "FINAL"}]},
        # a command lost with a killed server, or a run interrupted by the kill: answer anyway
        {"on": "restart", "repeat": True, "do": [{"reply": "FINAL"}]},
    ]}


def parent_script(rng: Any, name: str, count: int, local: bool = False) -> dict[str, Any]:
    """``count`` children, alternately remote and local (all local with ``local``), awaited
    and not, each with a random duration; the parent notes every wake and every restart."""
    delegates = []
    for n in range(count):
        remote, awaited = n % 2 == 0 and not local, (n // 2) % 2 == 0
        child = child_script(rng, awaited)
        where = "remote" if remote else "local"
        delegate: dict[str, Any] = {"task": child, "id": f"c{n}",
                                    "title": f"{name}.{n} {where} {'awaited' if awaited else 'follow-up'}"}
        if remote:
            delegate["environment"] = "peer"
        delegates.append({"delegate": delegate})
    return {"tether_script": 1, "rules": [
        {"on": "start", "do": [*delegates, {"reply": "delegated"}]},
        {"on": "delegated_task", "repeat": True, "do": [{"reply": "got it"}]},
        {"on": "restart", "repeat": True, "do": [{"reply": "restarted"}]},
    ]}


@pytest.mark.parametrize("process_backend", ["linux", "portable"])
def test_chaos_kills_lose_and_duplicate_nothing(servers: Any, subreaper: Any, process_backend: str) -> None:
    """Once per process backend (SPEC §13), both environments on it."""
    rng = rng_for("chaos")
    backend = {"TETHER_PROCESSES": process_backend}
    origin, peer = servers("origin", backend), servers("peer", backend)
    start_all([origin, peer])
    link(origin, peer)
    started = time.monotonic()

    parents: dict[str, int] = {}  # parent id -> tasks it delegates
    for n in range(PARENTS):
        parents[new_thread(origin, parent_script(rng, f"p{n}", PER_PARENT), f"p{n}")] = PER_PARENT
    for parent_id in parents:  # every delegation recorded: the chaos starts with all tasks open
        wait_idle(origin, parent_id)
    note(f"chaos: {PARENTS * PER_PARENT} tasks delegated in {time.monotonic() - started:.1f}s")

    # the chaos: random moments, random victims, random downtimes (this is the experiment,
    # not synchronisation)
    victims_plan = ["origin", "peer", "both"]
    rng.shuffle(victims_plan)
    victims_plan += [rng.choice(["origin", "peer", "both"]) for _ in range(KILLS - len(victims_plan))]
    timeline = []
    for k, victim in enumerate(victims_plan[:KILLS]):
        time.sleep(rng.uniform(*GAP))
        down = [s for s in (origin, peer) if victim in (s.name, "both")]
        for server in down:
            server.kill()
        killed_at = time.monotonic() - started
        lost = _lose_commands(rng, down)
        time.sleep(rng.uniform(*DOWN))
        start_all(down)
        subreaper({s.process.pid for s in (origin, peer) if s.process})
        timeline.append(f"{killed_at:.1f}s {victim} ({lost} commands lost)")
        # a new parent right after the restart: its own delegations race the next kill
        parents[new_thread(origin, parent_script(rng, f"late{k}", LATE_TASKS), f"late{k}")] = LATE_TASKS
    note(f"chaos: kills at {', '.join(timeline)}")

    chaos_over = time.monotonic()
    with Pulse([origin, peer]) as pulse:
        try:
            tasks = pulse.wait_for(lambda: _quiet(origin, peer, set(parents)), SETTLE_TIMEOUT,
                                   "every parent settled and every task terminal and delivered")
            settled_in = time.monotonic() - chaos_over
        except AssertionError as error:
            tasks, settled_in = None, float("nan")
            timed_out = str(error)
    subreaper({s.process.pid for s in (origin, peer) if s.process})

    views = {p: origin.get(f"/api/threads/{p}") for p in parents}
    all_tasks = [t for t in origin.get("/api/tasks")["tasks"] if t["parentThreadId"] in parents]
    # A parent whose first run was cut short by a kill delegated only part of its children
    # (the rest was never accepted); every other parent delegated all of them.
    expected = {p: n for p, n in parents.items() if views[p]["runs"][0]["status"] == "completed"}
    problems = check_exactly_once(views, all_tasks, expected)
    problems += _same_on_both_sides(origin, peer, all_tasks)
    finals = sum(1 for t in all_tasks if (t["result"] or {}).get("text") == "FINAL")
    roots = sum(1 for t in all_tasks if not t["followUpOf"])
    note(f"chaos: {roots} tasks (+{len(all_tasks) - roots} follow-ups), {finals} FINAL results; "
         f"settled {settled_in:.1f}s after the last restart; {len(problems)} problems")
    note(f"chaos: what the kills hit: {_hits(origin, peer, all_tasks)}")
    if tasks is None:
        problems.insert(0, timed_out)
    assert not problems, "\n".join(problems[:60])


def _lose_commands(rng: Any, down: list[Any]) -> int:
    """Some background commands die with their server (as in a reboot): their wrappers are
    killed while tether is down, so they are gone, not adopted, when it starts again."""
    lost = 0
    for server in down:
        for pid in sorted(leftover_wrappers(server.data)):
            if rng.random() < LOSE:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                    lost += 1
    return lost


def _quiet(origin: Any, peer: Any, parents: set[str]) -> list[dict[str, Any]] | None:
    """Everything is over: every thread on both sides settled, every task of our parents
    terminal and delivered with FINAL in each chain, and no child command still running
    (a child that answered from a ``restart`` run may still get its command's end)."""
    if not all(t["settled"] for t in origin.get("/api/threads")["threads"]):
        return None
    if not all(t["settled"] for t in peer.get("/api/threads")["threads"]):
        return None
    tasks = [t for t in origin.get("/api/tasks")["tasks"] if t["parentThreadId"] in parents]
    if any(t["status"] in ("queued", "running") or t["delivery"]["state"] not in ("acknowledged", "disposed")
           for t in tasks):
        return None
    chains: dict[str, bool] = {}
    for task in tasks:
        root = task["followUpOf"] or task["taskId"]
        chains[root] = chains.get(root, False) or (task["result"] or {}).get("text") == "FINAL"
    if not all(chains.values()):
        return None
    # only now the per-thread reads: the children's background commands
    for task in tasks:
        if task["followUpOf"]:
            continue
        side = peer if task["childEnvironmentId"] != task["parentEnvironmentId"] else origin
        child = side.get(f"/api/threads/{task['childThreadId']}")
        if any(item["status"] == "running" for item in child["background"]):
            return None
    return tasks


def _hits(origin: Any, peer: Any, tasks: list[dict[str, Any]]) -> str:
    """How many children the kills reached, and how: so a run shows that it tested something."""
    counts: Counter[str] = Counter()
    for task in tasks:
        if task["followUpOf"]:
            continue
        side = peer if task["childEnvironmentId"] != task["parentEnvironmentId"] else origin
        child = side.get(f"/api/threads/{task['childThreadId']}")
        counts["interrupted runs"] += sum(1 for r in child["runs"] if r["status"] == "interrupted")
        counts["restart runs"] += sum(1 for r in child["runs"] if r["trigger"]["kind"] == "restart")
        counts["lost commands"] += sum(1 for i in child["background"] if i["status"] == "failed")
        counts["children hit"] += any(r["trigger"]["kind"] == "restart" for r in child["runs"])
    return ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))


def _same_on_both_sides(origin: Any, peer: Any, tasks: list[dict[str, Any]]) -> list[str]:
    """G5: the origin's record of each remote task (follow-ups too) is the peer's."""
    problems = []
    remote = {t["taskId"]: t for t in tasks if t["childEnvironmentId"] != t["parentEnvironmentId"]}
    theirs = {t["taskId"]: t for t in peer.get("/api/tasks")["tasks"]
              if t["parentThreadId"] in {r["parentThreadId"] for r in remote.values()}}
    for missing in sorted(set(theirs) - set(remote)):
        problems.append(f"{missing}: on the peer ({theirs[missing]['status']}, "
                        f"{(theirs[missing]['result'] or {}).get('text')!r}) but unknown to the origin")
    for task_id, mine in remote.items():
        other = theirs.get(task_id)
        if other is None:
            problems.append(f"{task_id}: a remote task the peer does not have")
            continue
        for key in ("status", "followUpOf", "childThreadId"):
            if mine[key] != other[key]:
                problems.append(f"{task_id}: {key} {mine[key]!r} on the origin, {other[key]!r} on the peer")
        if (mine["result"] or {}).get("text") != (other["result"] or {}).get("text"):
            problems.append(f"{task_id}: result {mine['result']!r} on the origin, "
                            f"{other['result']!r} on the peer")
    return problems
