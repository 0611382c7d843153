"""Deadlines across a link (SPEC §11): the origin keeps a remote task's deadline, so it
fires while the link is blackholed and after the origin was SIGKILLed, once; the child's
later answer still reaches the parent exactly once; ``cancel`` reaches the child through
the durable push and stops its commands.

Children wait on a gate file the test creates, so the answer comes when the test says.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from blackhole import BlackholeProxy
from linkkit import await_delivered, await_on, final_count, first_run_done_with_command, remote_child_started

from kit import (
    env_id,
    link,
    link_status,
    new_thread,
    poll,
    process_gone,
    recorded_pid,
    start_all,
    tasks_of,
    thread,
    wake_messages,
)
from tether.ids import parse_time
from tether.launch import Server


@pytest.fixture(scope="module")
def linked(module_servers: Any) -> Iterator[dict[str, Any]]:
    """origin → blackhole proxy → peer."""
    origin, peer = module_servers("origin"), module_servers("peer")
    start_all([origin, peer])
    proxy = BlackholeProxy(peer.port).start()
    try:
        link(origin, peer, url=proxy.url)
        yield {"origin": origin, "peer": peer, "proxy": proxy, "peerId": env_id(peer)}
    finally:
        proxy.close()


@pytest.fixture
def up(linked: dict[str, Any]) -> dict[str, Any]:
    """Both servers running and the link passing (a failed test may have left them not)."""
    linked["proxy"].heal()
    for server in (linked["origin"], linked["peer"]):
        if server.process is None or server.process.poll() is not None:
            server.start()
    return linked


def gated_child(gate: Path) -> dict[str, Any]:
    """Awaits a command that runs until ``gate`` exists; WAITING, then FINAL."""
    command = f"while [ ! -e {gate} ]; do sleep 0.05; done; echo OK"
    return {"tether_script": 1, "rules": [
        {"on": "start", "do": [{"bash": command, "background": True, "await": True, "id": "b1"},
                               {"reply": "WAITING"}]},
        {"on": "background_command", "do": [{"reply": "FINAL"}]},
    ]}


def parent_of(child: dict[str, Any], deadline_ms: int, on_deadline: str = "wake") -> dict[str, Any]:
    delegate = {"task": child, "id": "c", "title": "remote suite", "environment": "peer",
                "deadline_ms": deadline_ms, "on_deadline": on_deadline}
    return {"tether_script": 1, "rules": [
        {"on": "start", "do": [{"delegate": delegate}, {"reply": "delegated"}]},
        {"on": "task_deadline", "repeat": True, "do": [{"reply": "late: {{text}}"}]},
        {"on": "delegated_task", "repeat": True, "do": [{"reply": "got {{text}}"}]},
    ]}


def notices(origin: Server, parent_id: str) -> list[dict[str, Any]]:
    return [m for m in thread(origin, parent_id)["messages"]
            if (m["source"] or {}).get("kind") == "task_deadline"]


def await_notice(origin: Server, parent_id: str, timeout: float = 30.0) -> dict[str, Any]:
    found = await_on(origin, lambda: notices(origin, parent_id), timeout, "the deadline notice")
    return found[0]


def assert_answer_once(origin: Server, parent_id: str) -> None:
    """FINAL reached the parent once, and the deadline told it once."""
    tasks, parent = await_delivered(origin, parent_id, 1)
    assert final_count(parent) == 1, [m["text"] for m in wake_messages(parent)]
    assert [t["result"]["text"] for t in tasks] == ["FINAL"], tasks
    assert tasks[0]["overdue"] is True
    assert len(notices(origin, parent_id)) == 1
    assert all(r["status"] == "completed" for r in parent["runs"]), parent["runs"]


def test_remote_wake_once_and_the_late_answer_once(up: dict[str, Any], tmp_path: Path) -> None:
    origin, peer = up["origin"], up["peer"]
    gate = tmp_path / "gate"
    parent_id = new_thread(origin, parent_of(gated_child(gate), deadline_ms=1500))
    remote_child_started(origin, peer, parent_id, first_run_done_with_command)
    notice = await_notice(origin, parent_id)
    assert '"remote suite"' in notice["text"] and "latest interim: WAITING" in notice["text"]
    assert "link to peer: ok" in notice["text"]
    gate.touch()
    assert_answer_once(origin, parent_id)


def test_a_deadline_fires_while_the_link_is_blackholed(up: dict[str, Any], tmp_path: Path) -> None:
    origin, peer, proxy = up["origin"], up["peer"], up["proxy"]
    gate = tmp_path / "gate"
    parent_id = new_thread(origin, parent_of(gated_child(gate), deadline_ms=4000))
    remote_child_started(origin, peer, parent_id, first_run_done_with_command)

    proxy.black()
    link_status(origin, up["peerId"], lambda e: e["status"] != "ok", 10, "the link to go down")
    notice = await_notice(origin, parent_id)
    assert "link to peer: ok" not in notice["text"] and "link to peer: " in notice["text"], notice["text"]
    assert tasks_of(origin, parent_id)[0]["status"] == "running"

    gate.touch()  # the child answers while the link is black
    proxy.heal()
    assert_answer_once(origin, parent_id)


def test_a_deadline_passes_while_the_origin_is_killed(up: dict[str, Any], tmp_path: Path) -> None:
    """It fires after the restart, once — and not again after a second SIGKILL."""
    origin, peer = up["origin"], up["peer"]
    gate = tmp_path / "gate"
    parent_id = new_thread(origin, parent_of(gated_child(gate), deadline_ms=2500))
    remote_child_started(origin, peer, parent_id, first_run_done_with_command)
    deadline = parse_time(tasks_of(origin, parent_id)[0]["deadlineAt"])

    origin.kill()
    _until(deadline)
    origin.start()
    await_notice(origin, parent_id)

    origin.kill()  # fired: a restart must not fire it again
    origin.start()
    gate.touch()
    assert_answer_once(origin, parent_id)


def _until(moment: datetime) -> None:
    """Let wall-clock time pass ``moment`` while the origin is down: nothing runs then, so
    there is no event to await; the passing of time is what this test is about."""
    left = (moment - datetime.now(UTC)).total_seconds()
    if left > 0:
        time.sleep(left + 0.2)


def test_cancel_reaches_the_remote_child_and_stops_its_commands(up: dict[str, Any], tmp_path: Path) -> None:
    origin, peer = up["origin"], up["peer"]
    parent_id = new_thread(origin, parent_of(gated_child(tmp_path / "never"), 1500, "cancel"))
    child_id, view = remote_child_started(origin, peer, parent_id, first_run_done_with_command)
    [item] = view["background"]
    # the pid is recorded as the wrapper starts; no event says when
    pid = poll(lambda: recorded_pid(peer, item["id"]), 10, "the pid file")

    [task], parent = await_delivered(origin, parent_id, 1)
    assert (task["status"], task["overdue"]) == ("cancelled", True)
    assert [m["source"]["taskIds"] for m in wake_messages(parent)] == [[task["taskId"]]]
    assert notices(origin, parent_id) == []

    def stopped() -> dict[str, Any] | None:
        child = thread(peer, child_id)
        return child if child["background"][0]["status"] == "cancelled" else None

    child = await_on(peer, stopped, 30, "the remote child's command to be cancelled")
    assert child["background"][0]["reason"] == "deadline" and child["cancelled"] is True
    with peer.client() as client:
        assert client.get(f"/api/tasks/{task['taskId']}").json()["status"] == "cancelled"
    # the killed wrapper is reaped by the peer's watcher; no event for the reaping itself
    poll(lambda: process_gone(pid), 20, f"process {pid} to be gone")


def test_remote_answers_racing_the_deadline_are_neither_lost_nor_doubled(up: dict[str, Any]) -> None:
    """Remote children answer around their deadline; the origin decides by what it has
    heard (SPEC §11: the origin keeps the deadline). Whichever came first: each answer
    reaches the parent once, and a task has a notice exactly when it is overdue — never
    one fired before it was due. An answer written just before the deadline may reach the
    origin just after it (the feed's lag): then it is overdue by what the origin heard,
    so only the answer well ahead of the deadline must never be."""
    origin = up["origin"]
    labels = {f"ANSWER-{chr(97 + n)}": offset for n, offset in enumerate([-700, -400, -100, 100, 400])}
    deadline_ms = 1500
    delegates = [
        {"delegate": {"task": {"tether_script": 1, "rules": [{"on": "start", "do": [
            {"sleep_ms": deadline_ms + offset}, {"reply": label}]}]},
            "id": label, "environment": "peer", "deadline_ms": deadline_ms}}
        for label, offset in labels.items()
    ]
    parent_id = new_thread(origin, {"tether_script": 1, "rules": [
        {"on": "start", "do": [*delegates, {"reply": "delegated"}]},
        {"on": "any", "repeat": True, "do": [{"reply": "noted"}]},
    ]})
    tasks, parent = await_delivered(origin, parent_id, len(labels))
    texts = [m["text"] for m in wake_messages(parent)]
    for label in labels:
        assert sum(text.count(f"\n{label}") for text in texts) == 1, (label, texts)
    fired = notices(origin, parent_id)
    noticed = [m["source"]["taskId"] for m in fired]
    due = {task["taskId"]: task["deadlineAt"] for task in tasks}
    for notice in fired:
        assert notice["createdAt"] >= due[notice["source"]["taskId"]], ("fired before it was due", notice)
    for task in tasks:
        assert task["status"] == "completed"
        assert noticed.count(task["taskId"]) == (1 if task["overdue"] else 0), task
    early = next(t for t in tasks if t["result"]["text"] == "ANSWER-a")  # 700 ms ahead of it
    assert not early["overdue"], early
