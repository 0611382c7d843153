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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from kit import link, new_thread, runs_of, shutdown, start_all, wake_messages
from tether.launch import Server

from .helpers import delegate, probe_1_with, providers, reply, rule, script, thread, wait_idle
from .links.linkkit import (
    assert_delivered_once,
    await_finished,
    first_run_done_with_command,
    remote_child_started,
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
    try:
        start_all([main, child])
        link(main, child)
        yield {"main": main, "child": child}
    finally:
        stopped(main, child)


def child_view(pair: dict[str, Server], record: dict[str, Any], where: str) -> dict[str, Any]:
    server = pair["main"] if where == "local" else pair["child"]
    with server.client() as client:
        return thread(client, record["tasks"][0]["childThreadId"])


def answers(child: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    return [(r["trigger"]["kind"], r["status"], r["reply"]) for r in child["runs"]]


# ---------------------------------------------------------------------------- the probes (SPEC §8)


def monitor_child(persistent: bool = False, first: str = "WAITING") -> str:
    """The first line comes well after the first turn is over: an event that arrives while
    a turn runs is taken into that turn by the CLI (no event turn, no progress run)."""
    lines = "sleep 3; for i in 1 2 3; do echo line$i; sleep 0.5; done"
    return model_script(
        start=[load("Monitor"), monitor(lines, persistent=persistent), say(first)],
        event=[[say("PROGRESS")]],
        end=[[say("FINAL")]],
    )


#: Ends well after the first turn (a task's end that arrives during a turn is taken into
#: that turn by the CLI: no turn of its own follows, and FINAL would be the first reply).
BACKGROUND = bash("sleep 2.5; echo OK", background=True)
AWAIT = {"tool": "mcp__tether__background_wait", "input": {"id": "{{background_id}}"}}
SCHEDULE = {"tool": "mcp__tether__schedule_wake", "input": {"inMs": 1000, "text": "time is up", "hold": True}}
FINAL = [[say("FINAL")]]

#: Each probe's child (task text), where it runs, and whether the parent ``thread_send``s
#: to it on its first wake.
PROBES: dict[str, tuple[str, str, bool]] = {
    "1-local": (model_script(start=[BACKGROUND, say("WAITING")], end=FINAL), "local", False),
    "1-remote": (model_script(start=[BACKGROUND, say("WAITING")], end=FINAL), "remote", False),
    "2-local": (monitor_child(), "local", False),
    "2-remote": (monitor_child(), "remote", False),
    "3-local": (
        model_script(start=[BACKGROUND, load(AWAIT["tool"]), AWAIT, say("WAITING")], end=FINAL),
        "local",
        False,
    ),
    "4-local": (
        model_script(start=[load(SCHEDULE["tool"]), SCHEDULE, say("WAITING")], message=FINAL),
        "local",
        False,
    ),
    "5-local": (model_script(start=[say("READY")], message=FINAL), "local", True),
    "6-local": (monitor_child(persistent=True, first="WATCHING"), "local", False),
}


def delegated(
    origin: Server, task: str, environment: str | None = None, send: bool = False
) -> dict[str, Any]:
    """A script parent delegates ``task`` to a claude child (in ``environment``) — and, if
    ``send``, ``thread_send``s to it on its first wake — and waits until FINAL reached it
    and every task is delivered; the records to check."""
    extra = {"environment": environment} if environment else {}
    rules = [
        rule("start", delegate(task, provider="claude", title="claude child", **extra), reply("delegated"))
    ]
    if send:
        send_on = {"thread_send": {"thread": "child:c", "text": "go on"}}
        rules.append(rule("delegated_task", send_on, reply("sent")))
    rules.append(rule("delegated_task", reply("got {{text}}"), repeat=True))
    parent_id = new_thread(origin, script(*rules))
    tasks, view = await_finished(origin, parent_id)
    assert_delivered_once(tasks, view)
    return {"tasks": tasks, "parent": view, "parentId": parent_id}


@pytest.fixture(scope="module")
def probes(pair: dict[str, Server]) -> dict[str, Any]:
    """Every probe at once (they mostly wait on their children), and probe 1 through the
    shared probe definitions too (``run the suite``); each record with its child's view."""

    def one(name: str) -> dict[str, Any] | AssertionError:
        try:
            if name == "1-suite":
                with pair["main"].client() as client:
                    return probe_1_with(pair["main"], client, "claude")
            task, where, send = PROBES[name]
            record = delegated(pair["main"], task, None if where == "local" else "child", send)
            return {**record, "child": child_view(pair, record, where)}
        except AssertionError as failed:  # the probe's own test reports it
            return failed

    names = ["1-suite", *PROBES]
    with ThreadPoolExecutor(len(names)) as pool:
        return dict(zip(names, pool.map(one, names), strict=True))


def probe(probes: dict[str, Any], name: str) -> dict[str, Any]:
    found = probes[name]
    if isinstance(found, AssertionError):
        raise found
    return dict(found)


def results(record: dict[str, Any]) -> tuple[str | None, list[str | None]]:
    """(the root task's result, the follow-ups' results)."""
    root = next(t for t in record["tasks"] if not t["followUpOf"])
    return root["result"]["text"], [t["result"]["text"] for t in record["tasks"] if t["followUpOf"]]


def assert_progress(record: dict[str, Any]) -> None:
    """Each monitor event was a ``monitor_event`` progress run (G4) whose PROGRESS is in
    ``progress[]`` and in no wake."""
    child = record["child"]
    root = next(t for t in record["tasks"] if not t["followUpOf"])
    events = runs_of(child, "monitor_event")
    assert events and all((r["status"], r["reply"]) == ("completed", "PROGRESS") for r in events), events
    assert [p["text"] for p in root["progress"]] == ["PROGRESS"] * len(events)
    notices = [m["text"] for m in child["messages"] if (m["source"] or {}).get("kind") == "monitor_event"]
    assert notices and all(n.startswith("line") for n in notices), notices
    assert all("PROGRESS" not in m["text"] for m in wake_messages(record["parent"]))


def test_probe_1_through_the_shared_probe_definition(probes: dict[str, Any]) -> None:
    record = probe(probes, "1-suite")
    row = record["row"]
    assert row["delivered"] and row["finalCount"] == 1 and row["deliveredAs"] == "follow-up", row
    [item] = record["child"]["background"]
    assert (item["kind"], item["status"], item["exitCode"]) == ("command", "ended", 0)


@pytest.mark.parametrize("where", ["local", "remote"])
def test_probe_1_background_bash(probes: dict[str, Any], where: str) -> None:
    """Background Bash: WAITING is the task's result, FINAL comes as a follow-up, once."""
    record = probe(probes, f"1-{where}")
    assert results(record) == ("WAITING", ["FINAL"])
    assert answers(record["child"]) == [
        ("task", "completed", "WAITING"),
        ("background_command", "completed", "FINAL"),
    ]


@pytest.mark.parametrize("where", ["local", "remote"])
def test_probe_2_monitor(probes: dict[str, Any], where: str) -> None:
    """The real Monitor tool: the monitor is held, so FINAL is the task's result, once; each
    event is a turn the CLI starts itself, which tether makes a progress run."""
    record = probe(probes, f"2-{where}")
    assert results(record) == ("FINAL", [])
    [item] = record["child"]["background"]
    assert (item["kind"], item["status"]) == ("monitor", "ended")
    [finished] = runs_of(record["child"], "monitor_finished")
    assert finished["reply"] == "FINAL"
    assert_progress(record)


def test_probe_3_background_wait_through_tethers_mcp_tools(probes: dict[str, Any]) -> None:
    """``mcp__tether__background_wait`` on the CLI's own background Bash (by its task id):
    the command is held, so the task completes once, with FINAL."""
    record = probe(probes, "3-local")
    assert results(record) == ("FINAL", [])
    assert answers(record["child"]) == [
        ("task", "completed", "WAITING"),
        ("background_command", "completed", "FINAL"),
    ]


def test_probe_4_schedule_wake_through_tethers_mcp_tools(probes: dict[str, Any]) -> None:
    """The CLI calls ``mcp__tether__schedule_wake`` on tether's ``/mcp`` with the thread's
    credential; the held wake keeps the task open, and tether's ``scheduled`` run (a prompt
    to the live session) answers FINAL: the task's result, once."""
    record = probe(probes, "4-local")
    assert results(record) == ("FINAL", [])
    assert answers(record["child"]) == [("task", "completed", "WAITING"), ("scheduled", "completed", "FINAL")]


def test_probe_5_thread_send_to_a_claude_child(probes: dict[str, Any]) -> None:
    """READY is the result; the parent's ``thread_send`` is prompted into the live session,
    and FINAL reaches the parent as a follow-up with its own wake."""
    record = probe(probes, "5-local")
    assert results(record) == ("READY", ["FINAL"])
    assert answers(record["child"]) == [("task", "completed", "READY"), ("message", "completed", "FINAL")]


def test_probe_6_persistent_monitor(probes: dict[str, Any]) -> None:
    """A persistent Monitor is not held: WATCHING is the result, its progress wakes nobody,
    and FINAL comes once, as a follow-up."""
    record = probe(probes, "6-local")
    assert results(record) == ("WATCHING", ["FINAL"])
    assert_progress(record)


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
    child = claude_server(tmp_path / name, name, model)
    try:
        link(pair["main"], child.start())
        yield child
    finally:
        stopped(child)


def stopped(*servers: Server) -> None:
    """SIGKILL (quicker than a graceful stop with sessions open; nothing there is awaited),
    then what ``kit.shutdown`` cleans."""
    for server in servers:
        server.kill()
    shutdown(list(servers), graceful=True)


@pytest.mark.parametrize(
    ("stop", "ends", "where"),
    [
        ("SIGKILL", "after the restart", "remote"),
        ("SIGTERM", "while tether is down", "remote"),
        ("SIGKILL", "while tether is down", "local"),
    ],
)
def test_a_stop_of_the_childs_environment_loses_no_answer(
    pair: dict[str, Server], victim: Server, tmp_path: Path, stop: str, ends: str, where: str
) -> None:
    """The child's environment (for a local child: the parent's too) is stopped while a
    background Bash of Claude Code runs. The CLI lives on, runs its wake turn (FINAL) when
    the command ends — before or after tether is back — and the restarted environment
    delivers that FINAL to the parent, once."""
    child = victim
    origin = pair["main"] if where == "remote" else child
    gate = tmp_path / "gate"
    task = model_script(
        start=[bash(f"while [ ! -e {gate} ]; do sleep 0.05; done; echo OK", background=True), say("WAITING")],
        end=[[say("FINAL")]],
    )
    extra = {"environment": child.name} if where == "remote" else {}
    parent = script(
        rule("start", delegate(task, provider="claude", **extra), reply("delegated")),
        rule("delegated_task", reply("got {{text}}"), repeat=True),
    )
    parent_id = new_thread(origin, parent)
    child_id, _ = remote_child_started(origin, child, parent_id, first_run_done_with_command)
    child.kill() if stop == "SIGKILL" else child.stop()
    if ends == "while tether is down":
        gate.touch()
    child.start()
    if ends == "after the restart":
        gate.touch()
    tasks, view = await_finished(origin, parent_id)
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
    """Claude Code refuses a permission mode it does not know, at start: its reason (on its
    stderr) is the run's error, not only the SDK's "Command failed with exit code 1"."""
    server = claude_server(tmp_path / "strict", "strict", model, 'permission_mode = "nonsense"\n').start()
    try:
        with server.client() as client:
            created = client.post("/api/threads", json={"provider": "claude", "message": "hello"})
            assert created.status_code == 201, created.text
            wait_idle(client, created.json()["threadId"], 60)
            [run] = thread(client, created.json()["threadId"])["runs"]
    finally:
        stopped(server)
    assert run["status"] == "failed"
    assert "argument 'nonsense' is invalid" in run["error"], run["error"]


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
