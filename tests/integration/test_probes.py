"""The six probes of SPEC §8 with local children: FINAL reaches the parent exactly once.

All six run at once in one server (module fixture, once per process backend: SPEC §13);
each test then checks one probe's record: how FINAL was delivered (result or follow-up),
that it was delivered once, and that progress replies and interim replies are never
answers (G1, G3, G4).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from kit import runs_of, wake_messages
from tether.launch import Server
from tether.probes import child_script, finished, outcome, parent_script

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

SECONDS = 0.6
DELIVERED_AS = {1: "follow-up", 2: "result", 3: "result", 4: "result", 5: "follow-up", 6: "follow-up"}
#: The child's first reply, which is the root task's result when FINAL comes as a follow-up.
FIRST_REPLY = {1: "WAITING", 5: "READY", 6: "WATCHING"}


def drive(server: Server, probe: int, watch: Server | None = None) -> dict[str, Any]:
    """Run one probe to its end: FINAL delivered, everyone settled, the child's work over.
    With ``watch`` (another process of the same environment, SPEC §12), the parent is made
    through ``server`` and everything after is awaited and read through ``watch``."""
    with server.client() as maker:
        parent_id = new_thread(maker, parent_script(probe, None, SECONDS), title=f"probe {probe}")
    server = watch or server
    with server.client() as client:
        watched = {parent_id}

        def check() -> dict[str, Any] | None:
            tasks = tasks_of(client, parent_id)
            watched.update(t["childThreadId"] for t in tasks if t["childThreadId"])
            parent = thread(client, parent_id)
            if not finished(tasks, parent):
                return None
            child = thread(client, tasks[0]["childThreadId"])
            if not child["settled"] or any(i["status"] == "running" for i in child["background"]):
                return None
            return {"tasks": tasks, "parent": parent, "child": child}

        await_threads(server, check, watched, what=f"probe {probe} to deliver FINAL")
        settled_tree(client, parent_id)
        record = check()  # read again once all is quiet: a late duplicate would show here
        assert record is not None
        record["outcome"] = outcome(
            probe, "local", record["tasks"], record["parent"], record["child"]["runs"]
        )
        return record


@pytest.fixture(scope="module")
def probes(backend_server: Server) -> dict[int, dict[str, Any]]:
    """The six probes, once per process backend (SPEC §13)."""
    with ThreadPoolExecutor(6) as pool:
        futures = {probe: pool.submit(drive, backend_server, probe) for probe in range(1, 7)}
        return {probe: future.result() for probe, future in futures.items()}


def test_health_names_the_process_backend(backend_server: Server, process_backend: str) -> None:
    with backend_server.client() as client:
        assert client.get("/api/health").json()["processes"] == process_backend


@pytest.mark.parametrize("probe", range(1, 7))
def test_final_delivered_exactly_once(probes: dict[int, dict[str, Any]], probe: int) -> None:
    record = probes[probe]
    row = record["outcome"]
    assert row["delivered"], f"FINAL reached the parent {row['finalCount']} times: {row}"
    assert row["finalCount"] == 1
    assert row["deliveredAs"] == DELIVERED_AS[probe], row

    tasks = record["tasks"]
    root = next(t for t in tasks if not t["followUpOf"])
    follow_ups = [t for t in tasks if t["followUpOf"]]
    if DELIVERED_AS[probe] == "result":
        assert root["result"]["text"] == "FINAL"
        assert root["status"] == "completed"
        assert follow_ups == [], "the answer came as the result: no follow-up may open"
        assert len(wake_messages(record["parent"])) == 1
    else:
        assert root["result"]["text"] == FIRST_REPLY[probe]
        assert [t["result"]["text"] for t in follow_ups] == ["FINAL"]
        assert follow_ups[0]["followUpOf"] == root["taskId"]
        assert root["followUps"] == [follow_ups[0]["taskId"]]
        assert len(wake_messages(record["parent"])) == 2, "the follow-up has its own wake"

    # G3: one wake per result, each task delivered to (and acknowledged by) a parent run.
    for task in tasks:
        assert task["delivery"]["state"] == "acknowledged", task
        assert task["delivery"]["deliveredAs"] == ("follow-up" if task["followUpOf"] else "result")
        assert task["delivery"]["wakeRunId"] in {r["runId"] for r in record["parent"]["runs"]}
    reported = wake_messages(record["parent"])
    assert sum(len(m["source"]["taskIds"]) for m in reported) == len(tasks)


@pytest.mark.parametrize("probe", range(1, 7))
def test_interim_and_progress_are_never_answers(probes: dict[int, dict[str, Any]], probe: int) -> None:
    record = probes[probe]
    texts = [m["text"] for m in wake_messages(record["parent"])]
    results = [(t.get("result") or {}).get("text") for t in record["tasks"]]
    # G4: progress replies never appear in results or wake texts.
    assert not any("PROGRESS" in (text or "") for text in results), results
    assert not any("PROGRESS" in text for text in texts), texts
    if DELIVERED_AS[probe] == "result":
        # The interim reply is never delivered when FINAL is the task's result (G1).
        assert not any("WAITING" in text for text in texts), texts
        first = record["child"]["runs"][0]
        assert first["trigger"]["kind"] == "task" and first["reply"] == "WAITING"
    # A wake says nothing else from the child: no prompt, no interim beyond the result.
    for text in texts:
        assert "tether_script" not in text


@pytest.mark.parametrize("probe", [2, 6])
def test_progress_runs_land_in_progress_only(probes: dict[int, dict[str, Any]], probe: int) -> None:
    record = probes[probe]
    progress_runs = runs_of(record["child"], "monitor_event")
    assert progress_runs, "the monitor's lines started progress runs"
    assert all(r["progress"] and r["reply"] == "PROGRESS" for r in progress_runs)
    noted = [p for t in record["tasks"] for p in t["progress"]]
    assert noted and {p["text"] for p in noted} == {"PROGRESS"}
    assert {p["runId"] for p in noted} <= {r["runId"] for r in progress_runs}
    # Progress woke nobody: every parent wake reports a real result.
    for message in wake_messages(record["parent"]):
        assert "PROGRESS" not in message["text"]
    if probe == 6:
        # A persistent monitor is not held: progress after the result opened no follow-up.
        assert len([t for t in record["tasks"] if t["followUpOf"]]) == 1


def test_probe_children_are_the_spec_scripts(probes: dict[int, dict[str, Any]]) -> None:
    """The probes ran the scripts of SPEC §8 (guards the fixture against drifting)."""
    for probe, record in probes.items():
        first = record["child"]["messages"][0]
        assert first["role"] == "user"
        assert json.loads(first["text"]) == child_script(probe, SECONDS)


def test_monitor_lines_fold_into_its_finished_run(backend_server: Server, tmp_path: Path) -> None:
    """The monitor prints and ends while the child's first run is still busy."""
    done = tmp_path / "monitor.done"
    child = script(
        rule(
            "start",
            {"monitor": f"echo line1; echo line2; touch {done}", "id": "m1"},
            # Wait (in the run) until the monitor's command has ended, then a little more so
            # tether has seen its end too, while this run is still running.
            {"bash": f"until [ -e {done} ]; do sleep 0.01; done"},
            {"sleep_ms": 500},
            reply("WAITING"),
        ),
        rule("monitor_event", reply("PROGRESS"), repeat=True),
        rule("monitor_finished", reply("FINAL")),
    )
    with backend_server.client() as client:
        parent_id = new_thread(client, noting_parent(child))
        settled_tree(client, parent_id)
        tasks = tasks_of(client, parent_id)
        child_view = thread(client, tasks[0]["childThreadId"])
        finished_runs = runs_of(child_view, "monitor_finished")
        root = tasks[0]
        assert root["result"]["text"] == "FINAL", (
            root["result"],
            [(r["trigger"]["kind"], r["reply"]) for r in child_view["runs"]],
        )
        assert len(finished_runs) == 1, "lines not yet handled fold into the one monitor_finished run"
