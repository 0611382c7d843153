"""G5: the six probes of SPEC §8 with the child in a second ``tether serve`` process behave
exactly as with a local child — FINAL exactly once, delivered the same way."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from linkkit import EXPECTED_AS, await_on, run_probes

from kit import env_id, link, new_thread, start_all, tasks_of, thread, wait_settled, wake_messages, wake_runs
from tether.launch import Server

PROBES = [1, 2, 3, 4, 5, 6]


@pytest.fixture(scope="module")
def pair(module_servers: Any) -> dict[str, Server]:
    origin, peer = module_servers("origin"), module_servers("peer")
    start_all([origin, peer])
    link(origin, peer)
    return {"origin": origin, "peer": peer}


@pytest.fixture(scope="module")
def probe_runs(pair: dict[str, Server]) -> dict[tuple[int, str], dict[str, Any]]:
    """All twelve probes (local and remote) at once: they mostly wait on their children."""
    origin, peer = pair["origin"], pair["peer"]
    jobs = [(origin, peer, p, where) for p in PROBES for where in ("local", "remote")]
    rows = run_probes(jobs)
    for row in rows:  # the destination's own copy of each remote task
        if row["outcome"]["where"] == "remote":
            with peer.client() as client:
                row["peerTasks"] = [client.get(f"/api/tasks/{t['taskId']}").json() for t in row["tasks"]]
    return {
        **{(r["outcome"]["probe"], r["outcome"]["where"]): r for r in rows},
        (0, "ids"): {"origin": env_id(origin), "peer": env_id(peer)},
    }


def _task_shape(task: dict[str, Any]) -> dict[str, Any]:
    """What a parent sees of a task, without ids and times (``progress[]`` is compared with
    the destination's copy in its own test below)."""
    return {
        "status": task["status"],
        "workState": task["workState"],
        "mode": task["mode"],
        "result": None if task["result"] is None else {
            "text": task["result"]["text"], "status": task["result"]["status"]},
        "followUp": task["followUpOf"] is not None,
        "followUps": len(task["followUps"]),
        "delivery": task["delivery"]["state"],
    }


def _answer_kinds(child: dict[str, Any]) -> list[str]:
    """The child's non-progress runs (progress runs may fold differently from run to run)."""
    return [r["trigger"]["kind"] for r in child["runs"] if r["trigger"]["kind"] != "monitor_event"]


@pytest.mark.parametrize("probe", PROBES)
def test_remote_probe_delivers_final_once_like_local(probe: int, probe_runs: Any) -> None:
    remote, local = probe_runs[probe, "remote"], probe_runs[probe, "local"]
    ids = probe_runs[0, "ids"]

    assert remote["outcome"]["delivered"], remote["outcome"]
    assert remote["outcome"]["finalCount"] == 1
    assert remote["outcome"]["deliveredAs"] == EXPECTED_AS[probe]
    assert local["outcome"]["deliveredAs"] == EXPECTED_AS[probe]

    # G5: same results, follow-ups and wakes as the local child
    for field in ("deliveredAs", "result", "followUps", "wakes", "finalCount"):
        assert remote["outcome"][field] == local["outcome"][field], (field, remote, local)
    assert [_task_shape(t) for t in remote["tasks"]] == [_task_shape(t) for t in local["tasks"]]

    # the child really ran on the peer, and knows its parent there
    task = remote["tasks"][0]
    assert task["childEnvironmentId"] == ids["peer"]
    assert task["parentEnvironmentId"] == ids["origin"]
    child = remote["child"]
    assert child["environmentId"] == ids["peer"]
    assert child["parentEnvironmentId"] == ids["origin"]
    assert child["parentThreadId"] == remote["parentId"]
    assert child["taskId"] == task["taskId"]
    assert _answer_kinds(child) == _answer_kinds(local["child"])

    # G4: progress and interim replies never reach the parent's wakes
    for message in wake_messages(remote["parent"]):
        assert "PROGRESS" not in message["text"]
        assert "WATCHING" not in message["text"] or probe == 6
    # each wake run is its own run, each task named by exactly one wake
    carried = [t for m in wake_messages(remote["parent"]) for t in m["source"]["taskIds"]]
    assert sorted(carried) == sorted(t["taskId"] for t in remote["tasks"])


def _mirrored(task: dict[str, Any]) -> dict[str, Any]:
    return {
        "taskId": task["taskId"],
        "status": task["status"],
        "result": task["result"],
        "interim": task["interim"],
        "progress": [(p["runId"], p["text"]) for p in task["progress"]],
        "followUpOf": task["followUpOf"],
        "followUps": task["followUps"],
    }


@pytest.mark.parametrize("probe", [
    *PROBES[:5],
    6,
])
def test_origin_copy_of_remote_task_matches_destination(probe: int, probe_runs: Any) -> None:
    """The origin follows the destination's feed: its copy of each task (and follow-up) ends
    up the same as the destination's — progress included (G4, G5)."""
    remote = probe_runs[probe, "remote"]
    assert [_mirrored(t) for t in remote["tasks"]] == [_mirrored(t) for t in remote["peerTasks"]]


# ---------------------------------------------------------------------- wait mode and cancel


def _both(pair: dict[str, Server], make: Any) -> dict[str, Any]:
    """Run ``make(origin, peer, environment)`` for a local and a remote child at once."""
    with ThreadPoolExecutor(2) as pool:
        local = pool.submit(make, pair["origin"], pair["origin"], None)
        remote = pool.submit(make, pair["origin"], pair["peer"], "peer")
        return {"local": local.result(), "remote": remote.result()}


def _waiter(timeout_ms: int) -> Any:
    child = {"tether_script": 1, "rules": [
        {"on": "start", "do": [{"bash": "sleep 1; echo OK", "background": True, "id": "b", "await": True},
                               {"reply": "WAITING"}]},
        {"on": "background_command", "do": [{"reply": "FINAL"}]}]}

    def make(origin: Server, child_env: Server, environment: str | None) -> dict[str, Any]:
        delegate: dict[str, Any] = {"task": child, "id": "c", "mode": "wait", "timeout_ms": timeout_ms}
        if environment:
            delegate["environment"] = environment
        parent_id = new_thread(origin, {"tether_script": 1, "rules": [
            {"on": "start", "do": [{"delegate": delegate},
                                   {"reply": "call: {{tasks.c.status}} {{tasks.c.result}}"}]},
            {"on": "delegated_task", "repeat": True, "do": [{"reply": "woken: {{text}}"}]}]})
        wait_settled(origin, parent_id)
        return {"parent": thread(origin, parent_id), "tasks": tasks_of(origin, parent_id)}

    return make


@pytest.mark.parametrize(("timeout_ms", "calls"), [
    (20_000, {"call: completed FINAL"}),  # the call delivers the result: it wakes nobody (G3)
    (200, {"call: running", "call: queued"}),  # timed out: the task goes on, its wake comes later (G8)
])
def test_a_wait_mode_delegation_behaves_the_same_remotely(
    pair: dict[str, Server], timeout_ms: int, calls: set[str]
) -> None:
    wakes = 0 if "FINAL" in str(calls) else 1
    seen = _both(pair, _waiter(timeout_ms))
    for where, got in seen.items():
        parent, tasks = got["parent"], got["tasks"]
        assert parent["runs"][0]["reply"].strip() in calls, (where, parent["runs"][0])
        assert len(wake_runs(parent)) == wakes, (where, parent["runs"])
        assert [t["result"]["text"] for t in tasks] == ["FINAL"], (where, tasks)
        assert tasks[0]["delivery"]["state"] == "acknowledged"
        assert tasks[0]["delivery"]["deliveredAs"] == ("call" if wakes == 0 else "result")
        if wakes:
            assert "FINAL" in wake_messages(parent)[0]["text"]
    assert len(seen["remote"]["parent"]["runs"]) == len(seen["local"]["parent"]["runs"])


def test_cancelling_a_remote_task_is_like_cancelling_a_local_one(pair: dict[str, Server]) -> None:
    child = {"tether_script": 1, "rules": [
        {"on": "start", "do": [{"bash": "sleep 60", "background": True, "id": "b", "await": True},
                               {"reply": "WAITING"}]},
        {"on": "any", "repeat": True, "do": [{"reply": "LATE"}]}]}

    def make(origin: Server, child_env: Server, environment: str | None) -> dict[str, Any]:
        delegate: dict[str, Any] = {"task": child, "id": "c"}
        if environment:
            delegate["environment"] = environment
        parent_id = new_thread(origin, {"tether_script": 1, "rules": [
            {"on": "start", "do": [{"delegate": delegate}, {"reply": "delegated"}]},
            {"on": "delegated_task", "repeat": True, "do": [{"reply": "woken: {{text}}"}]}]})

        def child_waiting() -> str | None:
            tasks = tasks_of(origin, parent_id)
            if not tasks or not tasks[0]["childThreadId"]:
                return None
            view = thread(child_env, tasks[0]["childThreadId"])
            running = [i for i in view["background"] if i["kind"] == "command" and i["status"] == "running"]
            return tasks[0]["taskId"] if running and view["runs"][0]["status"] == "completed" else None

        task_id = await_on(child_env, child_waiting, 30, "the child to wait on its command")
        with origin.client() as client:
            cancelled = client.post(f"/api/tasks/{task_id}/cancel", json={"reason": "enough"})
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["status"] == "cancelled"  # at once, across the link too
        wait_settled(origin, parent_id)
        child_id = tasks_of(origin, parent_id)[0]["childThreadId"]

        def child_stopped() -> dict[str, Any] | None:
            view = thread(child_env, child_id)
            return view if view["settled"] and view["cancelled"] else None

        return {"parent": thread(origin, parent_id), "tasks": tasks_of(origin, parent_id),
                "child": await_on(child_env, child_stopped, 30, "the child to be stopped")}

    seen = _both(pair, make)
    for where, got in seen.items():
        tasks, parent, child = got["tasks"], got["parent"], got["child"]
        assert [(t["status"], t["result"]) for t in tasks] == \
            [("cancelled", {"text": None, "runId": None, "status": "cancelled"})], (where, tasks)
        assert len(wake_runs(parent)) == 1, (where, parent["runs"])
        assert "cancelled" in wake_messages(parent)[0]["text"]
        assert [i["status"] for i in child["background"] if i["kind"] == "command"] == ["cancelled"], where
        assert all(r["reply"] != "LATE" for r in child["runs"]), (where, child["runs"])
    remote_task = seen["remote"]["tasks"][0]
    with pair["peer"].client() as client:
        assert client.get(f"/api/tasks/{remote_task['taskId']}").json()["status"] == "cancelled"
