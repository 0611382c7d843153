"""SIGKILL and restart (G6): nothing accepted is lost, nothing is delivered twice.

One server holds several scenarios at once; it is killed with SIGKILL at a moment when
every scenario is at its interesting point, the test does what each scenario needs while
the server is down (end a command, kill a process group), and the same ``Server`` is
started again on the same data directory and port.

Commands are steered with ``flock``: a command blocks on a lock the test holds, and ends
the moment the test lets go — no timing guesses. So that a command killed while tether is
down is really gone (not left as a zombie nobody reaps), this test process becomes a
child subreaper for the module and reaps what it kills.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from kit import (
    await_exit,
    finals,
    is_alive,
    kill_group,
    leftover_wrappers,
    reap,
    reap_zombie_children,
    recorded_exit,
    runs_of,
    set_subreaper,
    wake_messages,
    wake_runs,
    wrapper_pid,
)
from tether.launch import Server

from .helpers import (
    await_threads,
    delegate,
    new_thread,
    noting_parent,
    reply,
    rule,
    script,
    settled_tree,
    tasks_of,
    thread,
    wait_idle,
)


@dataclass
class Scenario:
    parent_id: str
    child_id: str = ""
    item_id: str = ""
    pid: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def started_then(flag: Path, rest: str) -> str:
    return f"touch {flag}; {rest}"


def until(flag: Path) -> dict[str, Any]:
    """A foreground step: wait (inside the run) until the background command has begun."""
    return {"bash": f"until [ -e {flag} ]; do sleep 0.01; done"}


def awaited_child(command: str, flag: Path, *, busy: bool) -> dict[str, Any]:
    """Start ``command`` in the background, awaited. ``busy``: then stay in the run (so a
    run is running when the server dies); else end the run with WAITING."""
    first: list[dict[str, Any]] = [
        {"bash": started_then(flag, command), "background": True, "await": True, "id": "b1"},
        until(flag),
    ]
    first += [reply("STARTED"), {"sleep_ms": 600_000}] if busy else [reply("WAITING")]
    return script(
        rule("start", *first),
        rule("restart", reply("LOST")),
        rule("background_command", reply("FINAL")),
    )


def await_child_waiting(server: Server, client: httpx.Client, parent_id: str, what: str) -> None:
    """Until the parent's first task is ``waiting_background`` (its child idle, holding work)."""
    watched = {parent_id}

    def check() -> bool:
        tasks = tasks_of(client, parent_id)
        watched.update(t["childThreadId"] for t in tasks)
        return bool(tasks) and tasks[0]["workState"] == "waiting_background"

    await_threads(server, check, watched, what=what)


@pytest.fixture(scope="module")
def restarted(tmp_path_factory: pytest.TempPathFactory, process_backend: str) -> Iterator[dict[str, Any]]:
    """Every scenario, once per process backend (SPEC §13: each adopts and reports alike)."""
    root = tmp_path_factory.mktemp(f"restart-{process_backend}")
    flags = root / "flags"
    flags.mkdir()
    locks = {name: open(root / f"{name}.lock", "w") for name in ("alive", "ended", "call")}  # noqa: SIM115
    for handle in locks.values():
        fcntl.flock(handle, fcntl.LOCK_EX)
    set_subreaper(True)
    server = Server(root / "env", "restart", env={"TETHER_PROCESSES": process_backend})
    try:
        server.start()
        with server.client() as client:
            env_id = client.get("/api/health").json()["environmentId"]
            s: dict[str, Scenario] = {}

            def lock_wait(name: str) -> str:
                return f"flock -s {root / f'{name}.lock'} true; echo OK"

            # A: a run is running and an awaited command is alive when the server dies; the
            #    command ends after the restart.
            s["alive"] = Scenario(
                new_thread(
                    client, noting_parent(awaited_child(lock_wait("alive"), flags / "alive", busy=True))
                )
            )
            # B: the command ends while the server is down (its wrapper records the status).
            s["ended"] = Scenario(
                new_thread(
                    client, noting_parent(awaited_child(lock_wait("ended"), flags / "ended", busy=False))
                )
            )
            # C: the command's process is gone after the restart.
            s["lost"] = Scenario(
                new_thread(client, noting_parent(awaited_child("sleep 600", flags / "lost", busy=False)))
            )
            # D: a running run and a lost command in the same thread.
            s["both"] = Scenario(
                new_thread(client, noting_parent(awaited_child("sleep 600", flags / "both", busy=True)))
            )
            # E: the command died while the server was down, and nobody reaped it (zombie).
            s["zombie"] = Scenario(
                new_thread(client, noting_parent(awaited_child("sleep 600", flags / "zombie", busy=False)))
            )
            # F: the parent is inside its wake run when the server dies.
            s["waking"] = Scenario(
                new_thread(
                    client,
                    script(
                        rule("start", delegate(script(rule("start", reply("FINAL")))), reply("delegated")),
                        rule("delegated_task", reply("GOT"), {"sleep_ms": 600_000}, reply("DONE")),
                        rule("restart", reply("RESTARTED")),
                    ),
                )
            )
            # G: the wake is queued behind the parent's long run when the server dies.
            s["queued"] = Scenario(
                new_thread(
                    client,
                    script(
                        rule("start", delegate(script(rule("start", reply("FINAL")))), {"sleep_ms": 600_000}),
                        rule("delegated_task", reply("got {{text}}"), repeat=True),
                        rule("restart", reply("RESTARTED")),
                    ),
                )
            )
            # H: the parent is blocked in a wait-mode delegate when the server dies; the call
            #    dies with it, so the result must come as a completion wake instead.
            s["call"] = Scenario(
                new_thread(
                    client,
                    script(
                        rule(
                            "start",
                            delegate(
                                awaited_child(lock_wait("call"), flags / "call", busy=False),
                                mode="wait",
                                timeout_ms=600_000,
                            ),
                            reply("after the call: {{tasks.c.result}}"),
                        ),
                        rule("delegated_task", reply("got {{text}}"), repeat=True),
                        rule("restart", reply("RESTARTED")),
                    ),
                )
            )

            # I: a held scheduled wake, most likely due while the server is down (either way
            #    it must fire once: before the kill or after the restart).
            s["timer"] = Scenario(
                new_thread(
                    client,
                    noting_parent(
                        script(
                            rule(
                                "start",
                                {"schedule": {"in_ms": 1000, "text": "time is up", "hold": True}},
                                reply("WAITING"),
                            ),
                            rule("scheduled", reply("FINAL {{text}}")),
                        )
                    ),
                )
            )

            # Bring every scenario to its moment.
            for name in ("alive", "ended", "lost", "both", "zombie"):
                scenario = s[name]
                wait_idle(client, scenario.parent_id)
                scenario.child_id = tasks_of(client, scenario.parent_id)[0]["childThreadId"]
                if name in ("alive", "both"):
                    await_threads(
                        server,
                        lambda sc=scenario: any(
                            m["text"] == "STARTED" for m in thread(client, sc.child_id)["messages"]
                        ),
                        {scenario.child_id},
                        what=f"{name}: child busy in its run",
                    )
                else:
                    wait_idle(client, scenario.child_id)
                scenario.item_id = thread(client, scenario.child_id)["background"][0]["id"]
                scenario.pid = wrapper_pid(server, scenario.item_id)
            await_child_waiting(server, client, s["call"].parent_id, what="call: child waiting")
            wait_idle(client, s["timer"].parent_id)  # its timer may have fired already: fine
            await_threads(
                server,
                lambda: any(
                    m["role"] == "assistant" and m["text"] == "GOT"
                    for m in thread(client, s["waking"].parent_id)["messages"]
                ),
                {s["waking"].parent_id},
                what="waking: parent inside its wake run",
            )
            await_threads(
                server,
                lambda: any(
                    r["trigger"]["kind"] == "delegated_task" and r["status"] == "queued"
                    for r in thread(client, s["queued"].parent_id)["runs"]
                ),
                {s["queued"].parent_id},
                what="queued: a wake queued behind the parent's run",
            )

        server.kill()

        # While the server is down.
        fcntl.flock(locks["ended"], fcntl.LOCK_UN)
        await_exit(s["ended"].pid)
        reap(s["ended"].pid)
        assert recorded_exit(server, s["ended"].item_id) == 0
        for name in ("lost", "both", "zombie"):
            kill_group(s[name].pid)
            await_exit(s[name].pid)
            if name != "zombie":
                reap(s[name].pid)
        assert not any(is_alive(s[name].pid) for name in ("lost", "both", "zombie"))
        assert is_alive(s["alive"].pid), "the alive scenario's command outlives the server"

        server.start()
        fcntl.flock(locks["alive"], fcntl.LOCK_UN)
        fcntl.flock(locks["call"], fcntl.LOCK_UN)
        with server.client() as client:
            for scenario in s.values():
                settled_tree(client, scenario.parent_id)
            yield {
                "server": server,
                "environmentId": env_id,
                "health": client.get("/api/health").json(),
                "scenarios": s,
                "parents": {name: thread(client, sc.parent_id) for name, sc in s.items()},
                "tasks": {name: tasks_of(client, sc.parent_id) for name, sc in s.items()},
                "children": {
                    name: thread(client, tasks_of(client, sc.parent_id)[0]["childThreadId"])
                    for name, sc in s.items()
                },
            }
    finally:
        server.stop()
        for pid in leftover_wrappers(server.data):
            kill_group(pid)
        for handle in locks.values():
            handle.close()
        set_subreaper(False)
        reap_zombie_children(keep=set())


def answer_once(record: dict[str, Any], name: str, text: str) -> None:
    """``text`` reached the parent exactly once, as the root task's result, in one wake."""
    tasks = record["tasks"][name]
    parent = record["parents"][name]
    assert [t["result"]["text"] for t in tasks] == [text], (name, tasks)
    assert tasks[0]["delivery"]["state"] == "acknowledged"
    wakes = wake_messages(parent)
    assert len(wakes) == 1 and len(wake_runs(parent)) == 1, [w["text"] for w in wakes]
    assert wakes[0]["text"].count(text) == 1


def test_same_environment_after_restart(restarted: dict[str, Any], process_backend: str) -> None:
    assert restarted["health"]["environmentId"] == restarted["environmentId"]
    assert restarted["health"]["processes"] == process_backend


def test_running_run_interrupted_and_command_adopted(restarted: dict[str, Any]) -> None:
    """A: the busy run is interrupted, the thread gets one restart run, the command that
    outlived the server is adopted and its end wakes the child, and FINAL arrives once."""
    child = restarted["children"]["alive"]
    first = child["runs"][0]
    assert first["trigger"]["kind"] == "task" and first["status"] == "interrupted"
    assert len(runs_of(child, "restart")) == 1
    command = child["background"][0]
    assert command["status"] == "ended" and command["exitCode"] == 0
    woken = runs_of(child, "background_command")
    assert [r["reply"] for r in woken] == ["FINAL"]
    answer_once(restarted, "alive", "FINAL")
    assert finals(restarted["parents"]["alive"]) == {restarted["tasks"]["alive"][0]["taskId"]: 1}


def test_command_that_ended_while_down(restarted: dict[str, Any]) -> None:
    """B: the wrapper's exit status is read after the restart and reported as usual."""
    child = restarted["children"]["ended"]
    command = child["background"][0]
    assert command["status"] == "ended" and command["exitCode"] == 0
    assert runs_of(child, "restart") == [], "no run was running, and no work was lost"
    assert [r["reply"] for r in runs_of(child, "background_command")] == ["FINAL"]
    answer_once(restarted, "ended", "FINAL")


def test_lost_command_gets_a_restart_run(restarted: dict[str, Any]) -> None:
    """C: a command whose process is gone is reported to its thread by a restart run."""
    child = restarted["children"]["lost"]
    command = child["background"][0]
    assert command["status"] == "failed"
    assert command["exitCode"] is None
    assert len(runs_of(child, "restart")) == 1
    assert runs_of(child, "background_command") == []
    answer_once(restarted, "lost", "LOST")
    assert "FINAL" not in " ".join(m["text"] for m in wake_messages(restarted["parents"]["lost"]))


def test_one_restart_run_per_thread(restarted: dict[str, Any]) -> None:
    """D: a running run and a lost command in one thread: still one restart run."""
    child = restarted["children"]["both"]
    assert child["runs"][0]["status"] == "interrupted"
    assert child["background"][0]["status"] == "failed"
    assert len(runs_of(child, "restart")) == 1, [(r["trigger"]["kind"], r["reply"]) for r in child["runs"]]
    answer_once(restarted, "both", "LOST")


def test_dead_unreaped_command_is_lost(restarted: dict[str, Any]) -> None:
    """E: like C, but the dead command's wrapper is a zombie nobody reaped."""
    child = restarted["children"]["zombie"]
    assert child["background"][0]["status"] == "failed", child["background"][0]
    assert len(runs_of(child, "restart")) == 1
    answer_once(restarted, "zombie", "LOST")


def test_interrupted_wake_run_stays_delivered(restarted: dict[str, Any]) -> None:
    """F: a wake the parent was handling stays delivered: it is in the thread, once."""
    parent = restarted["parents"]["waking"]
    wakes = wake_messages(parent)
    assert len(wakes) == 1 and wakes[0]["text"].count("FINAL") == 1
    assert [r["status"] for r in wake_runs(parent)] == ["interrupted"]
    assert [r["reply"] for r in runs_of(parent, "restart")] == ["RESTARTED"]
    task = restarted["tasks"]["waking"][0]
    assert task["result"]["text"] == "FINAL"
    assert task["delivery"]["wakeRunId"] == wake_runs(parent)[0]["runId"]
    assert task["delivery"]["state"] == "acknowledged"


def test_queued_wake_delivered_after_restart(restarted: dict[str, Any]) -> None:
    """G: a wake queued when the server died runs after the restart, once."""
    parent = restarted["parents"]["queued"]
    assert parent["runs"][0]["status"] == "interrupted"
    assert len(runs_of(parent, "restart")) == 1
    wakes = wake_runs(parent)
    assert [r["status"] for r in wakes] == ["completed"]
    assert wakes[0]["reply"].count("FINAL") == 1
    assert len(wake_messages(parent)) == 1
    assert restarted["tasks"]["queued"][0]["delivery"]["state"] == "acknowledged"


def test_wait_call_cut_by_restart_becomes_a_wake(restarted: dict[str, Any]) -> None:
    """H: the wait-mode call died with the server; the result arrives once, as a wake."""
    parent = restarted["parents"]["call"]
    first = parent["runs"][0]
    assert first["status"] == "interrupted" and first["reply"] is None
    assert [r["reply"] for r in runs_of(parent, "restart")] == ["RESTARTED"]
    answer_once(restarted, "call", "FINAL")
    task = restarted["tasks"]["call"][0]
    assert task["mode"] == "wait" and task["delivery"]["deliveredAs"] == "result"
    assert wake_runs(parent)[0]["reply"].count("FINAL") == 1


def test_scheduled_wake_across_restart(restarted: dict[str, Any]) -> None:
    """I: a held scheduled wake fires once, also when it fell due while tether was down."""
    child = restarted["children"]["timer"]
    assert [r["reply"] for r in runs_of(child, "scheduled")] == ["FINAL time is up"]
    assert child["background"][0]["status"] == "ended"
    answer_once(restarted, "timer", "FINAL time is up")


def test_script_state_survives(restarted: dict[str, Any]) -> None:
    """Fired rules are kept: no child ran its start rule twice across the restart."""
    for name, child in restarted["children"].items():
        starts = [
            m for m in child["messages"] if m["role"] == "assistant" and m["text"] in ("STARTED", "WAITING")
        ]
        assert len(starts) <= 1, (name, [m["text"] for m in child["messages"]])
        assert len([r for r in child["runs"] if r["trigger"]["kind"] == "task"]) == 1


def test_nothing_left_running(restarted: dict[str, Any]) -> None:
    """Nothing waits forever: after the restart every thread settled, every task ended."""
    for name, tasks in restarted["tasks"].items():
        assert all(t["status"] not in ("queued", "running") for t in tasks), name
    for name, parent in restarted["parents"].items():
        assert parent["settled"], name
        assert all(i["status"] != "running" for i in parent["background"]), name
    assert not any(
        os.path.exists(f"/proc/{sc.pid}") and is_alive(sc.pid)
        for sc in restarted["scenarios"].values()
        if sc.pid
    )
