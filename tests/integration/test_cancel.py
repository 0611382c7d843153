"""``POST /api/tasks/{id}/cancel`` (SPEC §2 "Cancelling").

The task is ``cancelled`` at once with the cancelled result, the child's run and commands
are stopped, the parent is woken exactly once with status cancelled, and later replies of
the child open no follow-ups.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from kit import await_exit, is_alive, runs_of, wake_entries, wake_messages, wake_runs, wrapper_pid
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
    wait_idle,
    wait_settled,
)

CANCELLED = {"text": None, "runId": None, "status": "cancelled"}


def long_child(flag: Path, *, busy: bool) -> dict[str, Any]:
    """Starts ``sleep 600`` (awaited) and — once the command has begun, so its wrapper has
    written its pid — replies WAITING, or stays busy in the run."""
    first: list[dict[str, Any]] = [
        {"bash": f"touch {flag}; sleep 600", "background": True, "await": True, "id": "b1"},
        {"bash": f"until [ -e {flag} ]; do sleep 0.01; done"},
    ]
    first += [reply("STARTED"), {"sleep_ms": 600_000}] if busy else [reply("WAITING")]
    return script(
        rule("start", *first),
        rule("background_command", reply("FINAL")),
        rule("user", reply("LATE"), repeat=True),
    )


def cancel(client: httpx.Client, task_id: str) -> dict[str, Any]:
    answer = client.post(f"/api/tasks/{task_id}/cancel", json={"reason": "test says stop"})
    assert answer.status_code == 200, answer.text
    return answer.json()


def assert_told_once(parent: dict[str, Any], task_id: str) -> None:
    wakes = wake_messages(parent)
    assert len(wakes) == 1 and len(wake_runs(parent)) == 1, [w["text"] for w in wakes]
    assert wakes[0]["source"]["taskIds"] == [task_id]
    entries = wake_entries(wakes[0]["text"])
    assert [task for task, _ in entries] == [task_id]
    assert f"{task_id}" in wakes[0]["text"] and ": cancelled]" in wakes[0]["text"]
    assert "FINAL" not in wakes[0]["text"] and "WAITING" not in wakes[0]["text"]


def test_cancel_task_waiting_on_a_command(backend_server: Server, tmp_path: Path) -> None:
    with backend_server.client() as client:
        parent_id = new_thread(client, noting_parent(long_child(tmp_path / "started", busy=False)))
        wait_idle(client, parent_id)
        task = tasks_of(client, parent_id)[0]
        child_id = task["childThreadId"]
        wait_idle(client, child_id)
        assert tasks_of(client, parent_id)[0]["workState"] == "waiting_background"
        item = thread(client, child_id)["background"][0]
        pid = wrapper_pid(backend_server, item["id"])
        assert is_alive(pid)

        answer = cancel(client, task["taskId"])
        assert answer == {"taskId": task["taskId"], "status": "cancelled"}
        # At once: no waiting for the child.
        now = client.get(f"/api/tasks/{task['taskId']}").json()
        assert now["status"] == "cancelled"
        assert now["result"] == CANCELLED
        assert now["completedAt"] is not None
        assert thread(client, child_id)["background"][0]["status"] == "cancelled"
        await_exit(pid, timeout=10)  # the command's process group was ended

        wait_settled(client, parent_id)
        parent = thread(client, parent_id)
        assert_told_once(parent, task["taskId"])
        assert client.get(f"/api/tasks/{task['taskId']}").json()["delivery"]["state"] == "acknowledged"

        # A second cancel changes nothing.
        assert cancel(client, task["taskId"]) == {"taskId": task["taskId"], "status": "cancelled"}

        # Later: the child answers again (someone writes to it); no follow-up, no wake.
        sent = client.post(f"/api/threads/{child_id}/messages", json={"text": "anything more?"})
        assert sent.status_code == 200, sent.text
        wait_settled(client, child_id)
        settled_tree(client, parent_id)
        child = thread(client, child_id)
        assert [r["reply"] for r in runs_of(child, "user")] == ["LATE"]
        assert runs_of(child, "background_command") == [], "the killed command woke nobody"
        tasks = tasks_of(client, parent_id)
        assert [t["taskId"] for t in tasks] == [task["taskId"]], "a cancelled task opens no follow-ups"
        assert tasks[0]["result"] == CANCELLED
        parent = thread(client, parent_id)
        assert_told_once(parent, task["taskId"])
        assert all("LATE" not in m["text"] for m in parent["messages"][1:]), "[0] is the script"


def test_cancel_task_with_a_running_run(backend_server: Server, tmp_path: Path) -> None:
    """The child's run is interrupted by the cancel, and its commands are ended."""
    with backend_server.client() as client:
        parent_id = new_thread(client, noting_parent(long_child(tmp_path / "started", busy=True)))
        wait_idle(client, parent_id)
        task = tasks_of(client, parent_id)[0]
        child_id = task["childThreadId"]
        await_threads(
            backend_server,
            lambda: any(m["text"] == "STARTED" for m in thread(client, child_id)["messages"]),
            {child_id},
            what="the child busy in its first run",
        )

        assert cancel(client, task["taskId"])["status"] == "cancelled"
        child = thread(client, child_id)
        assert child["runs"][0]["status"] == "cancelled"
        assert child["status"] == "idle"
        assert [i["status"] for i in child["background"]] == ["cancelled"]
        assert client.get(f"/api/tasks/{task['taskId']}").json()["result"] == CANCELLED

        settled_tree(client, parent_id)
        assert_told_once(thread(client, parent_id), task["taskId"])
        assert len(tasks_of(client, parent_id)) == 1


def test_cancel_unknown_task(shared_server: Server) -> None:
    with shared_server.client() as client:
        answer = client.post("/api/tasks/tsk_0000000000000000/cancel", json={})
        assert answer.status_code == 404
        assert answer.json()["error"]["code"] == "not_found"


def test_cancel_reaches_nested_tasks(backend_server: Server, tmp_path: Path) -> None:
    """Cancelling a task cancels the tasks its child delegated, and ends their commands; only
    the top parent is told (the cancelled child is not woken for its own child)."""
    grandchild = long_child(tmp_path / "started", busy=False)
    child = script(
        rule("start", {"delegate": {"task": grandchild, "id": "g"}}, reply("CHILD WAITING")),
        rule("delegated_task", reply("child got {{text}}"), repeat=True),
    )
    with backend_server.client() as client:
        parent_id = new_thread(client, noting_parent(child))
        wait_idle(client, parent_id)
        task = tasks_of(client, parent_id)[0]
        child_id = task["childThreadId"]
        watched = {parent_id, child_id}

        def grandchild_waiting() -> dict[str, Any] | None:
            nested = tasks_of(client, child_id)
            watched.update(t["childThreadId"] for t in nested)
            return nested[0] if nested and nested[0]["workState"] == "waiting_background" else None

        nested = await_threads(backend_server, grandchild_waiting, watched, what="the grandchild waiting")
        grandchild_id = nested["childThreadId"]
        pid = wrapper_pid(backend_server, thread(client, grandchild_id)["background"][0]["id"])

        assert cancel(client, task["taskId"])["status"] == "cancelled"
        nested_now = client.get(f"/api/tasks/{nested['taskId']}").json()
        assert nested_now["status"] == "cancelled" and nested_now["result"] == CANCELLED
        assert thread(client, grandchild_id)["background"][0]["status"] == "cancelled"
        await_exit(pid, timeout=10)

        settled_tree(client, parent_id)
        wait_settled(client, child_id)
        assert_told_once(thread(client, parent_id), task["taskId"])
        assert runs_of(thread(client, child_id), "delegated_task") == [], "the cancelled child is not woken"
        assert client.get(f"/api/tasks/{nested['taskId']}").json()["delivery"]["state"] == "disposed"
