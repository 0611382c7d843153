"""The ``claude`` provider against the REAL Claude Code CLI (the one the ``claude-agent-sdk``
wheel bundles), whose model is the scripted Anthropic Messages API server of
``models/anthropic_server.py``: real background Bash, the real Monitor tool, real task
notifications and the turns the CLI starts itself, real MCP calls to tether's ``/mcp``.

Each child's task text scripts the model (``model_script``); parents are script threads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tether.launch import Server

from .conftest import _shutdown
from .helpers import delegate, probe_1_with, providers, reply, rule, runs_of, script, thread, wait_idle
from .links.linkkit import (
    assert_delivered_once,
    await_finished,
    first_run_done_with_command,
    link,
    new_thread,
    remote_child_started,
    start_all,
    wake_messages,
)
from .models.anthropic_server import ModelServer
from .models.claudekit import bash, claude_server, load, model_script, monitor, requires_cli, say

pytestmark = requires_cli


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelServer]:
    server = ModelServer(tmp_path_factory.mktemp("model") / "requests.jsonl").start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, model: ModelServer) -> Iterator[dict[str, Server]]:
    """``main`` (script parents, and local claude children) linked to ``child`` (remote
    claude children)."""
    root = tmp_path_factory.mktemp("claude-cli")
    main = claude_server(root / "main", "main", model)
    child = claude_server(root / "child", "child", model)
    start_all([main, child])
    link(main, child)
    yield {"main": main, "child": child}
    stopped(main, child)


@pytest.fixture
def client(pair: dict[str, Server]) -> Iterator[httpx.Client]:
    with pair["main"].client() as found:
        yield found


MONITOR_CHILD = model_script(
    start=[load("Monitor"), monitor("for i in 1 2 3; do sleep 0.4; echo line$i; done"), say("WAITING")],
    event=[[say("PROGRESS")]],
    end=[[say("FINAL")]],
)


def delegated(origin: Server, task: str, environment: str | None = None) -> dict[str, Any]:
    """A script parent delegates ``task`` to a claude child (in ``environment``), waits
    until FINAL reached it and every task is delivered; the records to check."""
    extra = {"environment": environment} if environment else {}
    parent = script(
        rule("start", delegate(task, provider="claude", title="claude child", **extra), reply("delegated")),
        rule("delegated_task", reply("got {{text}}"), repeat=True),
    )
    parent_id = new_thread(origin, parent)
    tasks, view = await_finished(origin, parent_id)
    assert_delivered_once(tasks, view)
    return {"tasks": tasks, "parent": view, "parentId": parent_id}


def child_view(pair: dict[str, Server], record: dict[str, Any], where: str) -> dict[str, Any]:
    server = pair["main"] if where == "local" else pair["child"]
    with server.client() as client:
        return thread(client, record["tasks"][0]["childThreadId"])


def answers(child: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    return [(r["trigger"]["kind"], r["status"], r["reply"]) for r in child["runs"]]


# ---------------------------------------------------------------------------- probe 1


def test_probe_1_local(pair: dict[str, Server], client: httpx.Client) -> None:
    """Background Bash: WAITING is the task's result, FINAL comes as a follow-up, once."""
    record = probe_1_with(pair["main"], client, "claude")
    row = record["row"]
    assert row["delivered"] and row["finalCount"] == 1 and row["deliveredAs"] == "follow-up", row
    assert answers(record["child"]) == [
        ("task", "completed", "WAITING"),
        ("background_command", "completed", "FINAL"),
    ]
    [item] = record["child"]["background"]
    assert (item["kind"], item["status"], item["exitCode"]) == ("command", "ended", 0)


@pytest.mark.parametrize("where", ["local", "remote"])
def test_probe_1_background_bash(pair: dict[str, Server], where: str) -> None:
    task = model_script(
        start=[bash("sleep 1; echo OK", background=True), say("WAITING")], end=[[say("FINAL")]]
    )
    record = delegated(pair["main"], task, None if where == "local" else "child")
    root = next(t for t in record["tasks"] if not t["followUpOf"])
    assert root["result"]["text"] == "WAITING"
    [follow_up] = [t for t in record["tasks"] if t["followUpOf"]]
    assert follow_up["result"]["text"] == "FINAL"
    child = child_view(pair, record, where)
    assert answers(child) == [("task", "completed", "WAITING"), ("background_command", "completed", "FINAL")]


# ---------------------------------------------------------------------------- probe 2


@pytest.mark.parametrize("where", ["local", "remote"])
def test_probe_2_monitor(pair: dict[str, Server], where: str) -> None:
    """The real Monitor tool: the monitor is held, so FINAL is the task's result, once. Each
    event is a turn the CLI starts itself: a ``monitor_event`` progress run (G4), whose
    PROGRESS is in ``progress[]`` and in no result or wake."""
    record = delegated(pair["main"], MONITOR_CHILD, None if where == "local" else "child")
    [task] = record["tasks"]
    assert task["result"]["text"] == "FINAL"
    child = child_view(pair, record, where)
    [item] = child["background"]
    assert (item["kind"], item["status"]) == ("monitor", "ended")
    [finished] = runs_of(child, "monitor_finished")
    assert finished["reply"] == "FINAL"
    events = runs_of(child, "monitor_event")
    assert events and all((r["status"], r["reply"]) == ("completed", "PROGRESS") for r in events), events
    assert [p["text"] for p in task["progress"]] == ["PROGRESS"] * len(events)
    notices = [m["text"] for m in child["messages"] if (m["source"] or {}).get("kind") == "monitor_event"]
    assert notices and all(n.startswith("line") for n in notices), notices
    assert all("PROGRESS" not in m["text"] for m in wake_messages(record["parent"]))


# ---------------------------------------------------------------------------- tether's tools (probe 4)


def test_probe_4_schedule_wake_through_tethers_mcp_tools(pair: dict[str, Server]) -> None:
    """The CLI calls ``mcp__tether__schedule_wake`` on tether's ``/mcp`` with the thread's
    credential; the held wake keeps the task open, and tether's ``scheduled`` run (a prompt
    to the live session) answers FINAL: the task's result, once."""
    wake = {"tool": "mcp__tether__schedule_wake", "input": {"inMs": 1000, "text": "time is up", "hold": True}}
    task = model_script(
        start=[load("mcp__tether__schedule_wake"), wake, say("WAITING")], message=[[say("FINAL")]]
    )
    record = delegated(pair["main"], task)
    [root] = record["tasks"]
    assert root["result"]["text"] == "FINAL"
    child = child_view(pair, record, "local")
    assert answers(child) == [("task", "completed", "WAITING"), ("scheduled", "completed", "FINAL")]


def test_model_server_saw_only_the_agent_loop_and_side_requests(model: ModelServer) -> None:
    """What the CLI asks of the model service (kept here so a CLI update that starts asking
    for something new shows up)."""
    paths = {(r["method"], r["path"].split("?")[0]) for r in model.requests}
    assert ("POST", "/v1/messages") in paths
    assert paths <= {
        ("POST", "/v1/messages"),
        ("POST", "/v1/messages/count_tokens"),
        ("HEAD", "/api/hello"),
        ("GET", "/api/hello"),
    }, paths


# ---------------------------------------------------------------------------- restarts (G1, G6)


@pytest.fixture
def victim(tmp_path: Path, model: ModelServer, pair: dict[str, Server]) -> Iterator[Server]:
    """A child environment of its own, linked from ``main``, for a test that stops it."""
    name = f"victim-{tmp_path.name[-12:]}"
    child = claude_server(tmp_path / name, name, model).start()
    link(pair["main"], child)
    yield child
    stopped(child)


def stopped(*servers: Server) -> None:
    """SIGKILL (quicker than a graceful stop with sessions open; nothing there is awaited),
    then what ``_shutdown`` cleans."""
    for server in servers:
        server.kill()
    _shutdown(list(servers))


@pytest.mark.parametrize(
    ("stop", "ends"),
    [("SIGKILL", "after the restart"), ("SIGTERM", "while tether is down")],
)
def test_a_stop_of_the_childs_environment_loses_no_answer(
    pair: dict[str, Server], victim: Server, tmp_path: Path, stop: str, ends: str
) -> None:
    """The child's environment is stopped while a background Bash of Claude Code runs. The
    CLI lives on, runs its wake turn (FINAL) when the command ends — before or after tether
    is back — and the restarted environment delivers that FINAL to the parent, once."""
    main, child = pair["main"], victim
    gate = tmp_path / "gate"
    task = model_script(
        start=[bash(f"while [ ! -e {gate} ]; do sleep 0.05; done; echo OK", background=True), say("WAITING")],
        end=[[say("FINAL")]],
    )
    parent = script(
        rule("start", delegate(task, provider="claude", environment=child.name), reply("delegated")),
        rule("delegated_task", reply("got {{text}}"), repeat=True),
    )
    parent_id = new_thread(main, parent)
    child_id, _ = remote_child_started(main, child, parent_id, first_run_done_with_command)
    child.kill() if stop == "SIGKILL" else child.stop()
    if ends == "while tether is down":
        gate.touch()
    child.start()
    if ends == "after the restart":
        gate.touch()
    tasks, view = await_finished(main, parent_id)
    assert_delivered_once(tasks, view)
    with child.client() as client:
        runs = answers(thread(client, child_id))
    assert runs == [("task", "completed", "WAITING"), ("background_command", "completed", "FINAL")], runs


# ---------------------------------------------------------------------------- what is not background work


def test_a_long_foreground_command_is_no_background_item(pair: dict[str, Server]) -> None:
    """Claude Code reports a foreground Bash of ~3 s or more as a task (``is_backgrounded:
    false``) with a notification at its end; the tool call waits for it and no turn
    follows: no item, no wake run — the answer is the task's result."""
    task = model_script(start=[bash("sleep 3.5; echo DONE"), say("FINAL")])
    record = delegated(pair["main"], task)
    child = child_view(pair, record, "local")
    assert answers(child) == [("task", "completed", "FINAL")]
    assert child["background"] == []
    [root] = record["tasks"]
    assert root["result"]["text"] == "FINAL" and not root["followUps"]


def test_a_background_subagent_is_an_agent_item_and_wakes_once(pair: dict[str, Server]) -> None:
    """A background subagent (whose own long command is its business, not the thread's)
    is one ``agent`` item; its end wakes the thread once, and that run's FINAL reaches the
    parent as a follow-up."""
    helper = model_script(start=[bash("sleep 3.5; echo SUB"), say("SUB DONE")])
    agent = {"description": "helper", "prompt": helper, "subagent_type": "claude", "run_in_background": True}
    task = model_script(start=[{"tool": "Agent", "input": agent}, say("WAITING")], end=[[say("FINAL")]])
    record = delegated(pair["main"], task)
    child = child_view(pair, record, "local")
    assert answers(child) == [("task", "completed", "WAITING"), ("background_command", "completed", "FINAL")]
    [item] = child["background"]
    assert (item["kind"], item["status"]) == ("agent", "ended"), item


# ---------------------------------------------------------------------------- start failures


def test_a_start_failure_says_the_clis_reason(tmp_path: Path, model: ModelServer) -> None:
    """As root, without ``IS_SANDBOX``, Claude Code refuses ``bypassPermissions`` at start:
    its reason (on its stderr) is the run's error, not only the SDK's "exit code 1"."""
    server = claude_server(tmp_path / "strict", "strict", model)
    del server.env["IS_SANDBOX"]
    server.start()
    try:
        with server.client() as client:
            created = client.post("/api/threads", json={"provider": "claude", "message": "hello"}).json()
            wait_idle(client, created["threadId"], 60)
            [run] = thread(client, created["threadId"])["runs"]
    finally:
        stopped(server)
    assert run["status"] == "failed"
    assert "root/sudo privileges" in run["error"], run["error"]


def test_providers_checks_the_real_cli(tmp_path: Path) -> None:
    """``tether providers``: the bundled CLI by default, that it runs, and that as root it
    needs ``IS_SANDBOX`` for bypassPermissions; a CLI that does not run says why."""
    (tmp_path / "config.toml").write_text("[providers.claude]\n")
    assert providers(tmp_path, {"IS_SANDBOX": "1"})["claude"] == {
        "provider": "claude",
        "usable": True,
        "reason": None,
    }
    if os.geteuid() == 0:
        reason = providers(tmp_path, {"IS_SANDBOX": ""})["claude"]["reason"]
        assert "IS_SANDBOX=1" in reason, reason
    broken = tmp_path / "claude"
    broken.write_text("#!/bin/sh\necho 'error: this CPU is not supported' >&2\nexit 1\n")
    broken.chmod(0o755)
    (tmp_path / "config.toml").write_text(f'[providers.claude]\ncli_path = "{broken}"\n')
    reason = providers(tmp_path, {"IS_SANDBOX": "1"})["claude"]["reason"]
    assert "does not run (exit 1): error: this CPU is not supported" in reason, reason


# ---------------------------------------------------------------------------- secrets


def _tool_results(model: ModelServer, marker: str) -> list[str]:
    """The tool results containing ``marker`` that the CLI sent to the model."""
    found = []
    for request in model.main_loop():
        for message in request["messages"]:
            for block in message["content"] if isinstance(message["content"], list) else []:
                text = json.dumps(block.get("content")) if block.get("type") == "tool_result" else ""
                if marker in text:
                    found.append(text)
    return found


def test_the_agents_commands_see_neither_the_api_key_nor_the_threads_credential(
    pair: dict[str, Server], model: ModelServer
) -> None:
    """The API key reaches the model service (through an ``apiKeyHelper``), but not the
    environment of the commands the agent runs; the MCP config with the thread's credential
    is gone once the CLI has read it — and tether's tools still work."""
    marker = "ENV-DUMP-7f3a"
    look = bash(f"echo {marker}; env; ls -a ../providers/claude")
    wake = {"tool": "mcp__tether__environment_links", "input": {}}
    task = model_script(start=[look, load("mcp__tether__environment_links"), wake, say("FINAL")])
    record = delegated(pair["main"], task)
    assert record["tasks"][0]["result"]["text"] == "FINAL"
    [seen] = set(_tool_results(model, marker))
    key = pair["main"].env["ANTHROPIC_API_KEY"]
    assert key not in seen and "ttc_" not in seen and ".mcp.json" not in seen, seen
    assert "ANTHROPIC_BASE_URL" in seen  # it is the environment
    assert {r["apiKey"] for r in model.main_loop()} == {key}
    links = _tool_results(model, "environmentId")
    assert links, "the tether tool answered"
