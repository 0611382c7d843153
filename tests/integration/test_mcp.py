"""The MCP tool surface at ``/mcp`` (SPEC §4, §5), driven by the official SDK's own client
against a real ``tether serve``.

Identity is the bearer token of each request: the admin token, a link token (fenced to
the threads it created) or a per-thread credential (acting as that thread even when it has
no run going: a completion wake then starts a run there).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from kit import runs_of, wake_messages
from tether.launch import Server
from tether.providers import PROVIDERS
from tether.tools.mcp import DESCRIPTIONS, describe

from .helpers import new_thread, reply, rule, script, tasks_of, thread, wait_settled

TOOLS = {
    "delegate_task", "task_status", "task_cancel", "thread_wait", "thread_send", "thread_read",
    "thread_interrupt", "thread_list", "background_wait", "monitor_start", "schedule_wake",
    "environment_links",
}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "raw", "version": "1"}},
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@asynccontextmanager
async def session(url: str, token: str) -> AsyncIterator[ClientSession]:
    """An initialized MCP session whose every request carries ``token``."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as found,
    ):
        await found.initialize()
        yield found


async def call(mcp: ClientSession, name: str, **arguments: Any) -> dict[str, Any]:
    """A tool call that must succeed; its structured result."""
    result = await mcp.call_tool(name, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def failure(mcp: ClientSession, name: str, **arguments: Any) -> dict[str, Any]:
    """A tool call that must fail with ``isError``; its ``{code, message}``."""
    result = await mcp.call_tool(name, arguments)
    assert result.is_error, result
    text = result.content[0].text  # type: ignore[union-attr]
    assert json.loads(text) == result.structured_content
    return result.structured_content


def credential(client: httpx.Client, thread_id: str) -> dict[str, Any]:
    minted = client.post(f"/api/threads/{thread_id}/credentials", json={"ttlSeconds": 600})
    assert minted.status_code == 200, minted.text
    return minted.json()


def idle_script() -> dict[str, Any]:
    """A thread that says hello, then notes every completion wake it gets."""
    return script(rule("start", reply("hello")), rule("delegated_task", reply("got {{text}}"), repeat=True))


async def test_lists_every_tool_with_schema_and_description(module_server: Server) -> None:
    async with session(f"{module_server.url}/mcp", module_server.token) as mcp:
        listed = (await mcp.list_tools()).tools
    by_name = {tool.name: tool for tool in listed}
    assert set(by_name) == TOOLS
    for tool in listed:
        assert tool.description, tool.name
        assert tool.input_schema.get("type") == "object", tool.name
    assert by_name["delegate_task"].input_schema["required"] == ["task"]
    assert {"task", "target", "mode", "timeoutMs", "hold", "title", "clientRequestId"} <= set(
        by_name["delegate_task"].input_schema["properties"]
    )
    assert set(by_name["schedule_wake"].input_schema["required"]) == {"inMs", "text"}
    assert by_name["environment_links"].input_schema.get("properties", {}) == {}


async def test_thread_credential_delegates_and_gets_woken(
    module_server: Server, module_client: httpx.Client
) -> None:
    client = module_client
    parent_id = new_thread(client, idle_script(), title="mcp parent")
    wait_settled(client, parent_id)
    minted = credential(client, parent_id)
    assert minted["mcpUrl"] == f"{module_server.url}/mcp"
    assert minted["token"] and minted["expiresAt"]

    async with session(minted["mcpUrl"], minted["token"]) as mcp:
        child_script = script(rule("start", reply("DONE")))
        started = await call(mcp, "delegate_task", task=child_script, title="over mcp", clientRequestId="k1")
        task_id = started["taskId"]
        again = await call(mcp, "delegate_task", task=child_script, title="over mcp", clientRequestId="k1")
        assert again["taskId"] == task_id  # G9: the repeat returns the first outcome

        waited = await call(mcp, "thread_wait", threadId=started["childThreadId"], untilSettled=True,
                            timeoutMs=30_000)
        assert waited["settled"] and not waited["timedOut"], waited
        status = await call(mcp, "task_status", taskId=task_id)
        assert status["status"] == "completed", status
        assert status["result"]["text"] == "DONE"
        assert status["parentThreadId"] == parent_id

        listed = await call(mcp, "thread_list")
        assert {parent_id, started["childThreadId"]} <= {t["threadId"] for t in listed["threads"]}
        read = await call(mcp, "thread_read", threadId=started["childThreadId"])
        assert "DONE" in [m["text"] for m in read["messages"]]

    # The credential acted as the parent thread, which had no run going: the completion
    # wake starts a run there, exactly once.
    wait_settled(client, parent_id)
    view = thread(client, parent_id)
    wakes = runs_of(view, "delegated_task")
    assert len(wakes) == 1 and wakes[0]["status"] == "completed", view["runs"]
    assert "DONE" in wakes[0]["reply"]
    assert len(wake_messages(view)) == 1
    assert all(len(m["text"]) > 0 for m in wake_messages(view))


async def test_a_task_is_found_and_cancelled_by_the_label_its_parent_gave_it(
    module_server: Server, module_client: httpx.Client
) -> None:
    client = module_client
    parent_id = new_thread(client, idle_script(), title="labels")
    other_id = new_thread(client, idle_script(), title="another parent")
    wait_settled(client, parent_id)
    slow = script(rule("start", {"sleep_ms": 30_000}))
    async with session(f"{module_server.url}/mcp", credential(client, parent_id)["token"]) as mcp:
        started = await call(mcp, "delegate_task", task=slow, label="slow one")
        assert (await call(mcp, "task_status", taskId="slow one"))["taskId"] == started["taskId"]
        assert started["label"] == "slow one"
        bad = await failure(mcp, "delegate_task", task=slow, label=" padded")
        cancelled = await call(mcp, "task_cancel", taskId="slow one")
    assert bad["code"] == "invalid" and "label" in bad["message"], bad
    assert (cancelled["taskId"], cancelled["status"]) == (started["taskId"], "cancelled"), cancelled
    async with session(f"{module_server.url}/mcp", credential(client, other_id)["token"]) as mcp:
        assert (await failure(mcp, "task_status", taskId="slow one"))["code"] == "not_found"
    assert [t["label"] for t in tasks_of(client, parent_id)] == ["slow one"]


async def test_wait_mode_hands_the_result_back(module_server: Server, module_client: httpx.Client) -> None:
    parent_id = new_thread(module_client, idle_script(), title="mcp wait parent")
    wait_settled(module_client, parent_id)
    minted = credential(module_client, parent_id)
    async with session(minted["mcpUrl"], minted["token"]) as mcp:
        done = await call(mcp, "delegate_task", task=script(rule("start", reply("WAITED"))), mode="wait",
                          timeoutMs=30_000)
    assert done["status"] == "completed" and done["result"]["text"] == "WAITED", done
    assert done["timedOut"] is False
    wait_settled(module_client, parent_id)
    assert runs_of(thread(module_client, parent_id), "delegated_task") == []  # G3: the call delivered it


async def test_another_threads_credential_cannot_touch_the_task(
    module_server: Server, module_client: httpx.Client
) -> None:
    client = module_client
    owner_id = new_thread(client, idle_script(), title="owner")
    other_id = new_thread(client, idle_script(), title="other")
    wait_settled(client, owner_id)
    wait_settled(client, other_id)
    owner, other = credential(client, owner_id), credential(client, other_id)

    long_child = script(rule("start", {"schedule": {"in_ms": 60_000, "text": "late", "hold": True}},
                             reply("WAITING")))
    async with session(owner["mcpUrl"], owner["token"]) as mcp:
        task_id = (await call(mcp, "delegate_task", task=long_child))["taskId"]
    try:
        async with session(other["mcpUrl"], other["token"]) as mcp:
            unknown = await failure(mcp, "task_status", taskId="tsk_0000")
            assert unknown["code"] == "not_found"
            read = await failure(mcp, "task_status", taskId=task_id)
            assert read["code"] in ("not_found", "forbidden"), read
            cancel = await failure(mcp, "task_cancel", taskId=task_id)
            assert cancel["code"] in ("not_found", "forbidden"), cancel
        async with session(owner["mcpUrl"], owner["token"]) as mcp:
            still = await call(mcp, "task_status", taskId=task_id)
            assert still["status"] in ("queued", "running"), still
    finally:
        async with session(owner["mcpUrl"], owner["token"]) as mcp:
            await mcp.call_tool("task_cancel", {"taskId": task_id, "reason": "test over"})
        wait_settled(client, owner_id)


async def test_link_token_sees_only_its_own_threads(
    module_server: Server, module_client: httpx.Client
) -> None:
    admin_thread = new_thread(module_client, idle_script(), title="admin's")
    minted = module_client.post("/api/link-tokens", json={"label": "mcp test peer"})
    assert minted.status_code in (200, 201), minted.text
    async with session(f"{module_server.url}/mcp", minted.json()["token"]) as mcp:
        listed = await call(mcp, "thread_list")
        assert listed["threads"] == []
        hidden = await failure(mcp, "thread_read", threadId=admin_thread)
        assert hidden["code"] == "not_found", hidden
        links = await call(mcp, "environment_links")
        assert links["links"] == []
    async with session(f"{module_server.url}/mcp", module_server.token) as mcp:
        assert admin_thread in {t["threadId"] for t in (await call(mcp, "thread_list"))["threads"]}


def test_no_or_bad_token_gets_401(module_server: Server) -> None:
    for headers in ({}, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Basic abc"}):
        answer = httpx.post(f"{module_server.url}/mcp", json=INITIALIZE,
                            headers={**MCP_HEADERS, **headers}, follow_redirects=False)
        assert answer.status_code == 401, (headers, answer.status_code, answer.text)
        assert answer.json()["error"]["code"] == "unauthorized"


def test_mcp_answers_at_exactly_that_path(module_server: Server) -> None:
    answer = httpx.post(
        f"{module_server.url}/mcp",
        json=INITIALIZE,
        headers={**MCP_HEADERS, "Authorization": f"Bearer {module_server.token}"},
        follow_redirects=False,
    )
    assert answer.status_code == 200, (answer.status_code, answer.headers, answer.text)
    assert answer.headers.get("mcp-session-id")


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return ([node["$ref"]] if "$ref" in node else []) + [r for v in node.values() for r in _refs(v)]
    return [r for v in node for r in _refs(v)] if isinstance(node, list) else []


async def test_schemas_and_descriptions_are_exact(module_server: Server) -> None:
    """What an agent reads through a real MCP client: every parameter described as it is for
    that tool, enums for modes and the child's provider, a closed typed ``target``, and
    self-contained schemas (no ``$ref``: agents' clients do not follow them)."""
    async with session(f"{module_server.url}/mcp", module_server.token) as mcp:
        tools = {tool.name: tool for tool in (await mcp.list_tools()).tools}
    for name, tool in tools.items():
        assert tool.description == DESCRIPTIONS[name]
        assert not _refs(tool.input_schema), name
        for parameter, schema in tool.input_schema.get("properties", {}).items():
            assert schema["description"] == describe(name, parameter), (name, parameter)

    delegate = tools["delegate_task"].input_schema["properties"]
    assert delegate["mode"]["enum"] == ["async", "wait"]
    [target] = [s for s in delegate["target"]["anyOf"] if s.get("type") == "object"]
    assert target["additionalProperties"] is False
    assert set(target["properties"]) == {"environmentId", "provider", "model"}
    assert target["properties"]["provider"]["enum"] == list(PROVIDERS)
    assert all(field["description"] for field in target["properties"].values())
    assert "required" not in target

    send = tools["thread_send"].input_schema["properties"]["mode"]
    assert send["enum"] == ["auto", "queue"] and send["default"] == "auto"
    assert "auto" in send["description"] and "async" not in send["description"]
    monitor = tools["monitor_start"].input_schema["properties"]
    assert "wait" not in monitor["timeoutMs"]["description"] and "Kill" in monitor["timeoutMs"]["description"]
    assert "label" in monitor["id"]["description"]
    assert set(monitor) == {"command", "persistent", "timeoutMs", "id"}


async def test_a_value_outside_an_enum_is_refused(module_server: Server, module_client: httpx.Client) -> None:
    before = module_client.get("/api/tasks").json()["tasks"]
    async with session(f"{module_server.url}/mcp", module_server.token) as mcp:
        bad_mode = await mcp.call_tool("delegate_task", {"task": "x", "mode": "later"})
        bad_target = await mcp.call_tool("delegate_task", {"task": "x", "target": {"provider": "nope"}})
        extra = await mcp.call_tool("delegate_task", {"task": "x", "target": {"host": "elsewhere"}})
    for result in (bad_mode, bad_target, extra):
        assert result.is_error, result
    assert module_client.get("/api/tasks").json()["tasks"] == before


async def test_arguments_the_schema_refuses_fail_as_code_and_message(
    module_server: Server, module_client: httpx.Client
) -> None:
    """A refusal before any tool runs is ``{code, message}`` like every other failure (SPEC
    §5): the message names each wrong argument, never its value; nothing changes."""
    before = module_client.get("/api/tasks").json()["tasks"]
    async with session(f"{module_server.url}/mcp", module_server.token) as mcp:
        missing = await failure(mcp, "task_status")
        typed = await failure(mcp, "delegate_task", task="x", mode="later", timeoutMs="soon-ish")
        unknown = await failure(mcp, "delegate_everything", task="x")
    assert missing["code"] == "invalid" and "taskId" in missing["message"], missing
    assert typed["code"] == "invalid", typed
    assert "mode" in typed["message"] and "timeoutMs" in typed["message"], typed
    assert "soon-ish" not in typed["message"]
    assert unknown["code"] == "unknown_tool" and "delegate_everything" in unknown["message"], unknown
    assert module_client.get("/api/tasks").json()["tasks"] == before
