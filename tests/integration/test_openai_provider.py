"""The ``openai`` provider against a fake OpenAI-compatible server on loopback.

A real ``tether serve`` whose ``[providers.openai]`` points at the fake (its API key in
the server's environment). The fake streams chunks exactly as the API does, with the
tool-call arguments cut into pieces, and is scripted per scenario by the thread's first
user message.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kit import shutdown
from tether.launch import Server
from tether.probes import outcome
from tether.providers.openai import _repair

from .fakes.openai_server import Call, FakeOpenAI, Reply, Text, first_user, last, tool_result
from .helpers import (
    await_state,
    probe_1_with,
    thread,
    wait_idle,
    wait_settled,
)

KEY_ENV = "FAKE_OPENAI_KEY"
KEY = "sk-fake-0123456789"
SUITE = "sleep 1; echo OK"
SLOW = "sleep 31.4159"


def model(messages: list[dict[str, Any]]) -> Reply:
    """What the fake model says next, by scenario (the first user message) and history."""
    scenario = first_user(messages)
    end = last(messages)
    if scenario == "run the suite":  # probe 1
        if end["role"] == "user" and "exited with code" in end["content"]:
            return Text("FINAL")
        if tool_result(messages, "bash") is not None:
            return Text("WAITING")
        return [Call("bash", {"command": SUITE, "background": True})]
    if scenario == "foreground":
        found = tool_result(messages, "bash")
        if found is not None:
            return Text(f"OUTPUT {found['output'].strip()} EXIT {found['exitCode']}")
        return [Call("bash", {"command": "echo hello from the foreground; exit 3"})]
    if scenario == "errors":
        if end["role"] == "tool":
            results = [json.loads(m["content"]) for m in messages[-3:] if m["role"] == "tool"]
            return Text("ERRORS " + " ".join(r["error"]["code"] for r in results))
        return [
            Call("task_status", {"taskId": "tsk_doesnotexist"}),
            Call("no_such_tool", {}),
            Call("schedule_wake", {"inMs": "soon"}),
        ]
    if scenario == "slow":
        if end["role"] == "user" and end["content"] == "go on":
            stopped = tool_result(messages[:-1], "bash")
            return Text(f"RECOVERED {stopped['error']['code'] if stopped else 'nothing'}")
        return [Text("RUNNING SLOW"), Call("bash", {"command": SLOW})]
    if scenario == "remember 42":
        return Text("NOTED" if end["content"] == "remember 42" else "YOU SAID 42")
    return Text(f"unscripted: {scenario!r}")


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(model, api_key=KEY) as found:
        yield found


def write_config(data: Path, fake: FakeOpenAI) -> None:
    data.mkdir(parents=True, exist_ok=True)
    (data / "config.toml").write_text(
        f'[providers.openai]\nbase_url = "{fake.url}"\nmodel = "fake-model"\napi_key_env = "{KEY_ENV}"\n'
    )


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, fake: FakeOpenAI) -> Iterator[Server]:
    data = tmp_path_factory.mktemp("openai") / "main"
    write_config(data, fake)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(KEY_ENV, KEY)  # tether.launch.Server passes the environment on
        server = Server(data, "main").start()
    yield server
    shutdown([server], graceful=True)


@pytest.fixture
def client(env: Server) -> Iterator[httpx.Client]:
    with env.client() as found:
        yield found


def start(client: httpx.Client, message: str) -> str:
    created = client.post("/api/threads", json={"provider": "openai", "message": message})
    assert created.status_code == 201, created.text
    return created.json()["threadId"]


def assistant_texts(view: dict[str, Any]) -> list[str]:
    return [m["text"] for m in view["messages"] if m["role"] == "assistant"]


def requests_of(fake: FakeOpenAI, scenario: str) -> list[dict[str, Any]]:
    return [r for r in fake.requests if first_user(r["messages"]) == scenario]


# ---------------------------------------------------------------------------- probe 1


def test_probe_1_with_an_openai_child(env: Server, client: httpx.Client, fake: FakeOpenAI) -> None:
    record = probe_1_with(env, client, "openai")
    tasks, parent, child = record["tasks"], record["parent"], record["child"]
    row = outcome(1, "local", tasks, parent, child["runs"])
    assert row["delivered"] and row["finalCount"] == 1, row
    assert child["provider"] == "openai"

    # The model's background bash call (arguments streamed in pieces) became a command.
    (command,) = [i for i in child["background"] if i["kind"] == "command"]
    assert command["command"] == SUITE and command["status"] == "ended" and command["exitCode"] == 0

    # First run: the tool call, then WAITING; the command's end woke the child: FINAL.
    kinds = [(r["trigger"]["kind"], r["status"], r["reply"]) for r in child["runs"]]
    assert kinds == [("task", "completed", "WAITING"), ("background_command", "completed", "FINAL")], kinds
    assert assistant_texts(child) == ["WAITING", "FINAL"]
    first_run = child["runs"][0]
    if first_run["endedAt"] < command["endedAt"]:  # the command outlasted the first run
        assert row["deliveredAs"] == "follow-up" and row["result"] == "WAITING", row
        assert row["followUps"] == ["FINAL"] and row["wakes"] == 2, row

    # The wake run continued the conversation kept in the thread's state.
    final_request = requests_of(fake, "run the suite")[-1]["messages"]
    roles = [m["role"] for m in final_request]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"], roles
    assert final_request[2]["tool_calls"][0]["function"]["name"] == "bash"
    assert json.loads(final_request[2]["tool_calls"][0]["function"]["arguments"]) == {
        "command": SUITE,
        "background": True,
    }
    assert final_request[4]["content"] == "WAITING"
    assert final_request[5]["content"].startswith("[notification: background_command]")
    assert "exited with code 0" in final_request[5]["content"]
    assert not fake.errors


# ---------------------------------------------------------------------------- tool calls


def test_foreground_bash_round_trip(client: httpx.Client, fake: FakeOpenAI) -> None:
    thread_id = start(client, "foreground")
    wait_settled(client, thread_id)
    view = thread(client, thread_id)
    (run,) = view["runs"]
    assert run["status"] == "completed", run
    assert run["reply"] == "OUTPUT hello from the foreground EXIT 3"
    assert view["background"] == []  # a foreground command is no background work
    (request,) = [r for r in requests_of(fake, "foreground") if r["messages"][-1]["role"] == "tool"]
    result = json.loads(request["messages"][-1]["content"])
    assert result == {"output": "hello from the foreground\n", "exitCode": 3, "timedOut": False}
    assert request["stream"] is True and request["model"] == "fake-model"
    names = {t["function"]["name"] for t in request["tools"]}
    assert {"bash", "delegate_task", "task_status", "monitor_start", "schedule_wake"} <= names
    assert len(names) == 13


def test_tool_errors_reach_the_model_as_content(client: httpx.Client, fake: FakeOpenAI) -> None:
    thread_id = start(client, "errors")
    wait_settled(client, thread_id)
    (run,) = thread(client, thread_id)["runs"]
    assert run["status"] == "completed", run
    assert run["reply"] == "ERRORS not_found unknown_tool invalid"
    (request,) = [r for r in requests_of(fake, "errors") if r["messages"][-1]["role"] == "tool"]
    results = [json.loads(m["content"]) for m in request["messages"] if m["role"] == "tool"]
    assert len(results) == 3
    assert results[0]["error"]["code"] == "not_found" and "tsk_doesnotexist" in results[0]["error"]["message"]
    assert all(set(r["error"]) == {"code", "message"} for r in results)


def test_history_carries_across_runs(client: httpx.Client, fake: FakeOpenAI) -> None:
    thread_id = start(client, "remember 42")
    wait_settled(client, thread_id)
    sent = client.post(f"/api/threads/{thread_id}/messages", json={"text": "which number?"})
    assert sent.status_code == 200, sent.text
    wait_settled(client, thread_id)
    view = thread(client, thread_id)
    assert [r["reply"] for r in view["runs"]] == ["NOTED", "YOU SAID 42"]
    messages = requests_of(fake, "remember 42")[-1]["messages"]
    assert [(m["role"], m["content"]) for m in messages[1:]] == [
        ("user", "remember 42"),
        ("assistant", "NOTED"),
        ("user", "which number?"),
    ]


def test_interrupted_tool_call_is_answered_in_the_next_run(
    env: Server, client: httpx.Client, fake: FakeOpenAI
) -> None:
    """A run stopped inside a foreground command: the command is killed, and the next run's
    history answers the dangling tool call (the API refuses a call without a result)."""
    thread_id = start(client, "slow")
    await_state(
        env,
        lambda: "RUNNING SLOW" in assistant_texts(thread(client, thread_id)),
        what="the model's text said before its slow bash call",
    )
    stopped = client.post(f"/api/threads/{thread_id}/interrupt", json={})
    assert stopped.status_code == 200, stopped.text
    wait_idle(client, thread_id)
    sent = client.post(f"/api/threads/{thread_id}/messages", json={"text": "go on"})
    assert sent.status_code == 200, sent.text
    wait_settled(client, thread_id)
    runs = thread(client, thread_id)["runs"]
    assert [(r["status"], r["reply"]) for r in runs] == [
        ("interrupted", None),
        ("completed", "RECOVERED interrupted"),
    ]
    roles = [m["role"] for m in requests_of(fake, "slow")[-1]["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "user"], roles
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and _runs(pid, SLOW)]


def _runs(pid: str, command: str) -> bool:
    try:
        return command.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_history_repair() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    other = {**call, "id": "c2"}
    history = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": None, "tool_calls": [call, other]},
        {"role": "tool", "tool_call_id": "c1", "content": "{}"},
    ]
    repaired = _repair(history)
    assert repaired[:3] == history
    assert repaired[3]["tool_call_id"] == "c2"
    assert json.loads(repaired[3]["content"])["error"]["code"] == "interrupted"
    assert _repair(repaired) == repaired


# ---------------------------------------------------------------------------- usability


def providers_json(data: Path, key: str | None) -> dict[str, dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    if key is not None:
        env[KEY_ENV] = key
    done = subprocess.run(
        [sys.executable, "-m", "tether", "providers", "--data", str(data), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    return {row["provider"]: row for row in json.loads(done.stdout)}


def test_providers_command_says_whether_openai_is_usable(tmp_path: Path, fake: FakeOpenAI) -> None:
    data = tmp_path / "data"
    write_config(data, fake)
    usable = providers_json(data, KEY)
    assert usable["openai"] == {"provider": "openai", "usable": True, "reason": None}
    assert usable["script"]["usable"]

    missing = providers_json(data, None)["openai"]
    assert missing["usable"] is False and KEY_ENV in missing["reason"]

    unconfigured = providers_json(tmp_path / "empty", KEY)["openai"]
    assert unconfigured["usable"] is False and "base_url" in unconfigured["reason"]


def test_unusable_provider_is_refused_with_a_reason(server: Server) -> None:
    """A server without the openai configuration refuses an openai thread, saying why."""
    with server.client() as plain:
        refused = plain.post("/api/threads", json={"provider": "openai", "message": "hello"})
    assert refused.status_code == 422, refused.text
    assert "base_url" in refused.json()["error"]["message"]
