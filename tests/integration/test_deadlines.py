"""Deadlines (SPEC §11) against a real ``tether serve``: a child that does not settle in
time wakes its parent once with how it stands, and its answer still arrives once later;
``cancel`` stops the child; answers racing the deadline are neither lost nor doubled; a
background command's own timeout ends it; the environment default; bad input.

Children wait on a *gate* (a file in the workspace the test creates) instead of sleeping,
so "the answer comes after the deadline notice" is an order the test sets, not a timing.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kit import await_exit, runs_of, wake_entries, wake_messages, wrapper_pid
from tether.ids import parse_time
from tether.launch import Server

from .helpers import (
    await_state,
    await_threads,
    delegate,
    new_thread,
    reply,
    rule,
    script,
    settled_tree,
    tasks_of,
    thread,
)
from .test_cli import tether
from .test_mcp import call, credential, failure, idle_script, session

DEADLINE_MS = 800


def gate() -> tuple[str, str]:
    """A gate's file name, and a background command that ends once the file exists."""
    name = f"gate-{uuid.uuid4().hex[:8]}"
    return name, f"while [ ! -e {name} ]; do sleep 0.05; done; echo OK"


def open_gate(server: Server, name: str) -> None:
    (server.data / "workspace" / name).touch()


def gated_child(command: str) -> dict[str, Any]:
    """Starts an awaited command, replies WAITING; FINAL once the command ended."""
    return script(
        rule("start", {"bash": command, "background": True, "await": True, "id": "b1"}, reply("WAITING")),
        rule("background_command", reply("FINAL")),
    )


def deadline_parent(*children: dict[str, Any], **options: Any) -> dict[str, Any]:
    """Delegates ``children`` (c1, c2 ...) with ``options``; notes deadlines and wakes."""
    actions = [delegate(child, f"c{n}", **options) for n, child in enumerate(children, 1)]
    return script(
        rule("start", *actions, reply("delegated")),
        rule("task_deadline", reply("late: {{text}}"), repeat=True),
        rule("delegated_task", reply("got {{text}}"), repeat=True),
    )


def deadline_notices(view: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in view["messages"] if (m["source"] or {}).get("kind") == "task_deadline"]


def results(view: dict[str, Any]) -> Counter[str]:
    """How often each result text reached the parent in its completion wakes."""
    return Counter(body for m in wake_messages(view) for _, body in wake_entries(m["text"]))


def test_wake_tells_the_parent_once_and_the_answer_still_arrives_once(shared_server: Server) -> None:
    name, command = gate()
    with shared_server.client() as client:
        parent_id = new_thread(
            client, deadline_parent(gated_child(command), title="suite", deadline_ms=DEADLINE_MS)
        )
        notice = await_state(
            shared_server, lambda: deadline_notices(thread(client, parent_id)), what="the deadline notice"
        )[0]
        [task] = tasks_of(client, parent_id)
        assert task["status"] == "running" and task["overdue"] is True and task["onDeadline"] == "wake"
        assert task["deadlineAt"] and notice["createdAt"] >= task["deadlineAt"]
        assert f'task {task["taskId"]} "suite"' in notice["text"]
        assert "status: running; workState: waiting_background" in notice["text"]
        assert "latest interim: WAITING" in notice["text"]
        assert "command b1" in notice["text"]

        open_gate(shared_server, name)
        settled_tree(client, parent_id)
        parent = thread(client, parent_id)
        [task] = tasks_of(client, parent_id)
        assert (task["status"], task["result"]["text"], task["overdue"]) == ("completed", "FINAL", True)
        assert task["delivery"]["state"] == "acknowledged"
        assert results(parent) == Counter({"FINAL": 1})
        assert len(deadline_notices(parent)) == 1 and len(runs_of(parent, "task_deadline")) == 1
        assert all(r["status"] == "completed" for r in parent["runs"])


def test_cancel_stops_the_child_s_commands_and_wakes_the_parent_once(shared_server: Server) -> None:
    _, command = gate()  # never opened: only the deadline ends this
    with shared_server.client() as client:
        parent_id = new_thread(
            client, deadline_parent(gated_child(command), deadline_ms=DEADLINE_MS, on_deadline="cancel")
        )
        child_id = await_state(
            shared_server,
            lambda: [t["childThreadId"] for t in tasks_of(client, parent_id) if t["childThreadId"]],
            what="the child",
        )[0]
        item = await_state(
            shared_server, lambda: thread(client, child_id)["background"], what="the child's command"
        )[0]
        pid = _await_pid(shared_server, item["id"])
        settled_tree(client, parent_id)
        await_exit(pid, timeout=10)  # the command's process group was ended

        parent, child = thread(client, parent_id), thread(client, child_id)
        [task] = tasks_of(client, parent_id)
        assert (task["status"], task["overdue"]) == ("cancelled", True)
        assert [m["source"]["taskIds"] for m in wake_messages(parent)] == [[task["taskId"]]]
        assert wake_entries(wake_messages(parent)[0]["text"]) == [(task["taskId"], "(no reply)")]
        assert deadline_notices(parent) == []
        [stopped] = child["background"]
        assert (stopped["status"], stopped["reason"]) == ("cancelled", "deadline")
        assert child["cancelled"] is True


def _await_pid(server: Server, item_id: str, timeout: float = 20.0) -> int:
    """The wrapper writes its pid file itself as it starts and no event announces that,
    so this is a bounded poll."""
    end = time.monotonic() + timeout
    while True:
        try:
            return wrapper_pid(server, item_id)
        except (OSError, ValueError):
            assert time.monotonic() < end, f"no pid file for {item_id} after {timeout}s"
            time.sleep(0.05)  # polling interval: no event to await for a file the wrapper writes


def test_answers_racing_the_deadline_are_neither_lost_nor_doubled(shared_server: Server) -> None:
    """Children answer from well before to well after their deadline. Whichever came
    first: each answer reaches the parent exactly once; a task is overdue (with one
    notice) exactly when its deadline passed while it was open."""
    offsets = [-400, -150, -50, 0, 50, 150, 400]
    children = [
        script(rule("start", {"sleep_ms": DEADLINE_MS + offset}, reply(f"FINAL{n}")))
        for n, offset in enumerate(offsets)
    ]
    with shared_server.client() as client:
        parent_id = new_thread(client, deadline_parent(*children, deadline_ms=DEADLINE_MS))
        await_state(
            shared_server,
            lambda: len(tasks_of(client, parent_id)) == len(offsets)
            and all(t["delivery"]["state"] == "acknowledged" for t in tasks_of(client, parent_id)),
            what="every answer delivered",
        )
        settled_tree(client, parent_id)
        parent, found = thread(client, parent_id), tasks_of(client, parent_id)
    assert results(parent) == Counter({f"FINAL{n}": 1 for n in range(len(offsets))})
    notices = Counter(m["source"]["taskId"] for m in deadline_notices(parent))
    for task in found:
        assert task["status"] == "completed"
        assert notices[task["taskId"]] == (1 if task["overdue"] else 0), task
        if task["completedAt"] < task["deadlineAt"]:
            assert not task["overdue"], ("fired before it was due", task)


def test_an_answer_before_the_deadline_never_fires_it(shared_server: Server) -> None:
    """The parent holds on a scheduled wake due after the deadline: the timer fires in
    due order, so once that wake ran, the deadline's moment has been handled too."""
    child = script(rule("start", reply("FINAL")))
    parent = deadline_parent(child, deadline_ms=DEADLINE_MS)
    later = {"schedule": {"in_ms": DEADLINE_MS + 300, "text": "later", "hold": True}}
    parent["rules"][0]["do"].insert(1, later)
    parent["rules"].append(rule("scheduled", reply("looked again")))
    with shared_server.client() as client:
        parent_id = new_thread(client, parent)
        await_state(
            shared_server,
            lambda: [r for r in runs_of(thread(client, parent_id), "scheduled") if r["reply"]],
            what="the scheduled wake after the deadline",
        )
        settled_tree(client, parent_id)
        view, [task] = thread(client, parent_id), tasks_of(client, parent_id)
    assert (task["status"], task["overdue"]) == ("completed", False)
    assert task["completedAt"] < task["deadlineAt"]
    assert deadline_notices(view) == [] and runs_of(view, "task_deadline") == []
    assert results(view) == Counter({"FINAL": 1})


def test_a_background_command_s_timeout_ends_it_and_wakes_its_thread(shared_server: Server) -> None:
    _, command = gate()  # never opened: only the timeout ends it
    body = script(
        rule("start", {"bash": command, "background": True, "id": "b1", "timeout_ms": 500}, reply("WAITING")),
        rule("background_command", reply("ended: {{text}}")),
    )
    with shared_server.client() as client:
        thread_id = new_thread(client, body)

        def woken() -> dict[str, Any] | None:
            view = thread(client, thread_id)
            done = [r for r in runs_of(view, "background_command") if r["status"] == "completed"]
            return view if done else None

        view = await_threads(shared_server, woken, {thread_id}, what="the timeout's wake")
    [item] = view["background"]
    assert (item["status"], item["reason"], item["exitCode"]) == ("ended", "timeout", None)
    [run] = runs_of(view, "background_command")
    assert "timed out: it was killed at its timeout of 500 ms" in run["reply"]
    await_exit(wrapper_pid(shared_server, item["id"]), timeout=10)


def test_the_environment_default_deadline_applies(server_factory: Any, tmp_path: Path) -> None:
    data = tmp_path / "defaulted"
    data.mkdir()
    (data / "config.toml").write_text("[tasks]\ndefault_deadline_ms = 600\n")
    server = server_factory("defaulted")
    name, command = gate()
    with server.client() as client:
        parent_id = new_thread(client, deadline_parent(gated_child(command)))
        await_state(server, lambda: deadline_notices(thread(client, parent_id)), what="the default's notice")
        [task] = tasks_of(client, parent_id)
        assert task["overdue"] and task["onDeadline"] == "wake"
        open_gate(server, name)
        settled_tree(client, parent_id)
        assert results(thread(client, parent_id)) == Counter({"FINAL": 1})


def test_a_bad_default_deadline_stops_the_start_with_a_clear_message(tmp_path: Path) -> None:
    data = tmp_path / "bad"
    data.mkdir()
    (data / "config.toml").write_text('[tasks]\ndefault_deadline_ms = "soon"\n')
    done = tether("serve", "--data", str(data), "--port", "1", timeout=60)
    assert done.returncode != 0
    assert "default_deadline_ms" in done.stdout + done.stderr


def test_task_list_shows_overdue(shared_server: Server) -> None:
    name, command = gate()
    with shared_server.client() as client:
        parent_id = new_thread(client, deadline_parent(gated_child(command), deadline_ms=DEADLINE_MS))
        await_state(shared_server, lambda: deadline_notices(thread(client, parent_id)), what="the notice")
        listed = tether("task", "list", "--parent", parent_id, "--url", shared_server.url,
                        "--token", shared_server.token)
        assert listed.returncode == 0, listed.stderr
        assert "OVERDUE" in listed.stdout, listed.stdout
        open_gate(shared_server, name)
        settled_tree(client, parent_id)


def test_bad_deadlines_are_refused_over_mcp_and_in_scripts(shared_server: Server) -> None:
    with shared_server.client() as client:
        parent_id = new_thread(client, idle_script(), title="deadline bad input")
        minted = credential(client, parent_id)
        before = tasks_of(client, parent_id)

        async def calls() -> list[dict[str, Any]]:
            async with session(minted["mcpUrl"], minted["token"]) as mcp:
                found = [
                    await failure(mcp, "delegate_task", task="x", deadlineMs=-5),
                    await failure(mcp, "delegate_task", task="x", deadlineMs=1000, onDeadline="later"),
                ]
                good = await call(mcp, "delegate_task", task="x", deadlineMs=60_000, onDeadline="cancel")
                assert good["deadlineAt"] and good["onDeadline"] == "cancel" and not good["overdue"]
                return found

        negative, unknown = asyncio.run(calls())
        assert negative["code"] == "invalid" and "deadlineMs" in negative["message"]
        assert unknown["code"] == "invalid" and "onDeadline must be 'wake' or 'cancel'" in unknown["message"]
        assert len(tasks_of(client, parent_id)) == len(before) + 1, "the refused calls made no task"

        bad = new_thread(client, script(rule("start", delegate("x", deadline_ms=0), reply("no"))))
        failed = await_state(
            shared_server,
            lambda: [r for r in thread(client, bad)["runs"] if r["status"] == "failed"],
            what="the script's run to fail",
        )[0]
        assert "deadlineMs must be a whole number" in failed["error"]
        assert tasks_of(client, bad) == []


def test_an_adopted_command_keeps_its_timeout_across_a_restart(server_factory: Any) -> None:
    """The timeout counts from the command's start, not from its adoption after a SIGKILL:
    one that ran out while tether was down is ended at once, not a full timeout later."""
    server = server_factory("adopting")
    _, command = gate()  # never opened: only the timeout ends it
    body = script(rule("start", {"bash": command, "background": True, "id": "b1", "timeout_ms": 3000},
                       reply("WAITING")))
    with server.client() as client:
        thread_id = new_thread(client, body)
        item = await_state(server, lambda: thread(client, thread_id)["background"], what="the command")[0]
    _await_pid(server, item["id"])
    server.kill()
    # tether is down, so nothing can announce the timeout passing: wait for the clock itself
    time.sleep(max(0.0, (parse_time(item["startedAt"]) - datetime.now(UTC)).total_seconds() + 3.2))
    server.start(timeout=60)  # a loaded machine may start slowly
    restarted = datetime.now(UTC)
    with server.client() as client:
        ended = await_state(
            server,
            lambda: [i for i in thread(client, thread_id)["background"] if i["status"] != "running"],
            what="the command to end",
        )[0]
    assert ended["reason"] == "timeout"
    assert (parse_time(ended["endedAt"]) - restarted).total_seconds() < 1.5, (
        "an adopted command ran a second full timeout"
    )
