"""Fuzzing (SPEC §9, G10): schemathesis drives every operation of the server's own
``/openapi.json`` with generated requests — valid ones, invalid ones, and valid ones aimed
at real threads, tasks and tokens — and no answer may be a 5xx; where the document
declares a response, the answer must conform to it. ``/api/events`` streams, so it is
fuzzed on its status and content type only, with a bounded read.

Then the MCP endpoint: malformed JSON-RPC posted to ``/mcp`` (invalid JSON, a wrong
version, unknown methods, missing or ill-typed params, batches, huge ids, deep nesting,
oversized bodies) gets JSON-RPC errors or 4xx, never a 5xx, and the server stays up and
keeps serving a proper MCP session.

Generation is seeded from the suite's seed (``TETHER_STRESS_SEED`` replays it).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from kit import new_thread
from tether.tools.mcp import SESSIONS_PER_TOKEN

from .stresskit import FULL, SEED, note, wait_idle

EXAMPLES = 200 if FULL else 12  # per operation and per kind of generation
MCP_EXAMPLES = 2000 if FULL else 60
INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "fuzz", "version": "1"}},
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
STREAMING = {"/api/events"}


@pytest.fixture(scope="module")
def target(module_servers: Any) -> Iterator[dict[str, Any]]:
    """A server with real records to aim at: a parent with a completed local task, an idle
    thread, and a link token."""
    server = module_servers("fuzz").start()
    child = {"tether_script": 1, "rules": [{"on": "start", "do": [{"reply": "FINAL"}]}]}
    parent = {"tether_script": 1, "rules": [
        {"on": "start", "do": [{"delegate": {"task": child, "id": "c"}}, {"reply": "delegated"}]},
        {"on": "any", "repeat": True, "do": [{"reply": "ok"}]}]}
    parent_id = new_thread(server, parent, "fuzz target")
    with server.client() as client:
        settled = client.get(f"/api/threads/{parent_id}/wait",
                             params={"untilSettled": "true", "timeoutMs": 30000})
        assert settled.json()["settled"], settled.text
        task = client.get("/api/tasks", params={"parentThreadId": parent_id}).json()["tasks"][0]
        token = client.post("/api/link-tokens", json={"label": "fuzz"}).json()
    wait_idle(server, task["childThreadId"])
    yield {"server": server, "ids": {"thread_id": parent_id, "task_id": task["taskId"],
                                     "token_id": token["tokenId"]}}


def _auth(server: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.token}"}


def test_openapi_fuzz_no_5xx_and_responses_match_the_schema(target: dict[str, Any]) -> None:
    server, ids = target["server"], target["ids"]
    headers = _auth(server)
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json", headers=headers)
    failures: dict[str, str] = {}
    calls = 0
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15, [op.label for op in operations]
    for operation in operations:
        strategies = [("positive", operation.as_strategy()),
                      ("negative", operation.as_strategy(generation_mode=GenerationMode.NEGATIVE))]
        params = {p: ids[p] for p in ids if "{" + p + "}" in operation.path}
        if params:
            strategies.append(("real ids", operation.as_strategy(path_parameters=params)))
            strategies.append(("real ids, negative", operation.as_strategy(
                generation_mode=GenerationMode.NEGATIVE, path_parameters=params)))
        for kind, strategy in strategies:

            @seed(SEED)
            @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=False,
                      suppress_health_check=list(HealthCheck), print_blob=True)
            @given(case=strategy)
            def fuzz(case: Any) -> None:
                nonlocal calls
                calls += 1
                if case.path in STREAMING:
                    _stream_once(case, headers)
                    return
                if case.path.endswith("/wait") and isinstance(case.query, dict):
                    timeout = case.query.get("timeoutMs")
                    if isinstance(timeout, int) and timeout > 2000:
                        case.query["timeoutMs"] = 2000  # a real wait may legitimately block that long
                response = case.call(headers=headers, timeout=30)
                case.validate_response(response, checks=[not_a_server_error, response_schema_conformance],
                                       headers=headers)
                if 400 <= response.status_code < 500:  # SPEC §4: {"error": {"code", "message"}}
                    error = response.json().get("error") or {}
                    assert isinstance(error.get("code"), str) and isinstance(error.get("message"), str), (
                        response.status_code, response.text[:500])

            try:
                fuzz()
            except Unsatisfiable:
                continue  # nothing to make invalid: the operation takes no input
            except Exception as error:
                failures[f"{operation.label} [{kind}]"] = f"{type(error).__name__}: {str(error)[:3000]}"
    assert httpx.get(f"{server.url}/api/health", timeout=10).status_code == 200
    note(f"fuzz: {calls} generated requests over {len(operations)} operations; {len(failures)} failing")
    assert not failures, "\n\n".join(f"== {k}\n{v}" for k, v in failures.items())


def _stream_once(case: Any, headers: dict[str, str]) -> None:
    """One request to a streaming endpoint: its status and first bytes, then hang up."""
    kwargs = case.as_transport_kwargs(headers=headers)
    kwargs.pop("timeout", None)
    with requests.request(**kwargs, stream=True, timeout=(5, 5)) as response:
        assert response.status_code < 500, (response.status_code, response.text[:500])
        if response.status_code == 200:
            assert response.headers["content-type"].startswith("text/event-stream"), response.headers
            first = next(response.iter_lines(), b"")
            assert first.startswith((b":", b"id:", b"event:", b"data:")), first
        else:
            assert 400 <= response.status_code < 500, response.status_code
            assert "error" in response.json(), response.text


# ---------------------------------------------------------------------- MCP

HUGE = 10**40

MALFORMED: list[tuple[str, bytes]] = [
    ("invalid JSON", b"{bad"),
    ("truncated JSON", b'{"jsonrpc": "2.0", "id": 1, "method": "initialize"'),
    ("empty body", b""),
    ("not UTF-8", b"\xff\xfe\xfd"),
    ("a JSON number", b"5"),
    ("a JSON string", b'"initialize"'),
    ("JSON null", b"null"),
    ("jsonrpc 1.0", json.dumps({**INITIALIZE, "jsonrpc": "1.0"}).encode()),
    ("no jsonrpc", json.dumps({k: v for k, v in INITIALIZE.items() if k != "jsonrpc"}).encode()),
    ("jsonrpc as a number", json.dumps({**INITIALIZE, "jsonrpc": 2.0}).encode()),
    ("unknown method", json.dumps({"jsonrpc": "2.0", "id": 1, "method": "no/such"}).encode()),
    ("method not a string", json.dumps({"jsonrpc": "2.0", "id": 1, "method": 7}).encode()),
    ("initialize without params", json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize"}).encode()),
    ("params a string", json.dumps({**INITIALIZE, "params": "x"}).encode()),
    ("empty batch", b"[]"),
    ("batch of two", json.dumps([INITIALIZE, {**INITIALIZE, "id": 2}]).encode()),
    ("batch of garbage", b"[1, 2, 3]"),
    ("huge integer id", json.dumps({**INITIALIZE, "id": HUGE}).encode()),
    ("huge negative id", json.dumps({**INITIALIZE, "id": -HUGE}).encode()),
    ("float id", json.dumps({**INITIALIZE, "id": 1.5}).encode()),
    ("object id", json.dumps({**INITIALIZE, "id": {"a": 1}}).encode()),
    ("100 kB string id", json.dumps({**INITIALIZE, "id": "x" * 100_000}).encode()),
    ("deep nesting", b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":' + b"[" * 100_000
     + b"]" * 100_000 + b"}"),
    ("over 1 MB", json.dumps({**INITIALIZE, "params": {**INITIALIZE["params"],
                                                        "pad": "x" * 1_100_000}}).encode()),
    ("a response, not a request", json.dumps({"jsonrpc": "2.0", "id": 1, "result": {}}).encode()),
    ("an error, not a request", json.dumps({"jsonrpc": "2.0", "id": 1, "error": {"code": 1}}).encode()),
]

IN_SESSION: list[tuple[str, Any]] = [
    ("tools/call without params", {"jsonrpc": "2.0", "id": 2, "method": "tools/call"}),
    ("tools/call without a name", {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {}}),
    ("tools/call of no such tool", {"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                                    "params": {"name": "no_such_tool", "arguments": {}}}),
    ("tools/call without arguments", {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                                      "params": {"name": "task_status"}}),
    ("tools/call with ill-typed arguments", {"jsonrpc": "2.0", "id": 6, "method": "tools/call",
                                             "params": {"name": "thread_read",
                                                        "arguments": {"threadId": 5, "limit": "x"}}}),
    ("tools/call with arguments a list", {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                                          "params": {"name": "thread_list", "arguments": [1]}}),
    ("unknown method", {"jsonrpc": "2.0", "id": 8, "method": "no/such"}),
    ("huge id", {"jsonrpc": "2.0", "id": HUGE, "method": "tools/list"}),
    ("wrong version", {"jsonrpc": "3.0", "id": 9, "method": "tools/list"}),
    ("a batch", [{"jsonrpc": "2.0", "id": 10, "method": "tools/list"}]),
    ("a notification of no such kind", {"jsonrpc": "2.0", "method": "notifications/no_such"}),
]


def _post(server: Any, body: bytes | Any, session: str | None = None, **headers: str) -> httpx.Response:
    sent = {**_auth(server), **MCP_HEADERS, **({"mcp-session-id": session} if session else {}), **headers}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{server.url}/mcp", content=content, headers=sent, timeout=30)


def _jsonrpc(response: httpx.Response) -> list[dict[str, Any]]:
    """The JSON-RPC messages of an answer, whether plain JSON or an SSE stream."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        return [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]
    found = response.json()
    return found if isinstance(found, list) else [found]


def _open_session(server: Any) -> str:
    opened = _post(server, INITIALIZE)
    assert opened.status_code == 200, opened.text
    session = opened.headers["mcp-session-id"]
    assert _post(server, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session).status_code < 300
    return session


def _assert_refused(what: str, response: httpx.Response, request_id: Any = None) -> None:
    """A 4xx, or a JSON-RPC answer: an error, or (for a valid request with an odd id) a
    result for that very id. Never a 5xx."""
    assert response.status_code < 500, (what, response.status_code, response.text[:500])
    if 400 <= response.status_code < 500 or response.status_code == 202:
        return
    messages = _jsonrpc(response)
    assert messages, (what, response.status_code, response.text[:500])
    for message in messages:
        assert message.get("jsonrpc") == "2.0", (what, message)
        if "error" in message:
            assert isinstance(message["error"].get("code"), int), (what, message)
        else:
            assert "result" in message and message.get("id") == request_id, (what, str(message)[:500])


@pytest.mark.parametrize("what,body", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_mcp_without_a_session(target: dict[str, Any], what: str, body: bytes) -> None:
    server = target["server"]
    try:
        request_id = json.loads(body).get("id")
    except (ValueError, AttributeError, UnicodeDecodeError, RecursionError):
        request_id = None
    _assert_refused(what, _post(server, body), request_id)
    assert httpx.get(f"{server.url}/api/health", timeout=10).status_code == 200


@pytest.mark.parametrize("what,body", IN_SESSION, ids=[m[0] for m in IN_SESSION])
def test_malformed_mcp_in_a_session(target: dict[str, Any], what: str, body: Any) -> None:
    server = target["server"]
    session = _open_session(server)
    request_id = body.get("id") if isinstance(body, dict) else None
    answer = _post(server, body, session)
    _assert_refused(what, answer, request_id)
    for message in _jsonrpc(answer) if answer.status_code == 200 else []:
        result = message.get("result") or {}
        if body.get("method") == "tools/call" and result:
            assert result.get("isError") is True, (what, result)
    # the session still works
    listed = _post(server, {"jsonrpc": "2.0", "id": 99, "method": "tools/list"}, session)
    assert listed.status_code == 200, listed.text
    assert len(_jsonrpc(listed)[0]["result"]["tools"]) >= 12


_scalar = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
_json: st.SearchStrategy[Any] = st.deferred(
    lambda: _scalar | st.lists(_json, max_size=3) | st.dictionaries(st.text(max_size=10), _json, max_size=3))
_requests = st.fixed_dictionaries(
    {"jsonrpc": st.sampled_from(["2.0", "2.0", "2.0", "1.0", 2]),
     "method": st.sampled_from(["initialize", "tools/list", "tools/call", "ping", "resources/list",
                                "prompts/list", "notifications/initialized", "no/such"])
     | st.text(max_size=15)},
    optional={"id": st.integers() | st.text(max_size=30) | st.none() | st.floats(allow_nan=False),
              "params": _json},
)


TOOLS = ["delegate_task", "task_status", "task_cancel", "thread_wait", "thread_send", "thread_read",
         "thread_interrupt", "thread_list", "background_wait", "monitor_start", "schedule_wake",
         "environment_links"]
_ids = st.sampled_from(["thr_0000000000000000", "tsk_0000000000000000", "", "b1", "../..", "x" * 300]) \
    | st.text(max_size=30)
_small = st.integers(-5, 10**12) | st.floats(allow_nan=True)
_reply = st.fixed_dictionaries({"reply": st.text(max_size=10)})
_script = st.fixed_dictionaries({"tether_script": st.just(1), "rules": st.lists(
    st.fixed_dictionaries({"on": st.sampled_from(["start", "any", "restart", "x"]),
                           "do": st.lists(_reply, max_size=2)}), max_size=2)})
#: well-typed values most of the time (to get past the argument validation), anything otherwise
TYPED: dict[str, st.SearchStrategy[Any]] = {
    "task": st.text(max_size=50) | _script,
    "target": st.fixed_dictionaries({}, optional={
        "environmentId": _ids, "provider": st.sampled_from(["script", "nope", ""]), "model": _ids}),
    "mode": st.sampled_from(["async", "wait", "", "sync"]), "timeoutMs": _small, "hold": st.booleans(),
    "title": st.text(max_size=30), "clientRequestId": _ids, "taskId": _ids, "reason": st.text(max_size=30),
    "threadId": _ids, "environmentId": _ids, "untilSettled": st.booleans(), "afterRunId": _ids,
    "message": st.text(max_size=30), "afterPosition": _small, "limit": _small, "stop": st.booleans(),
    "id": _ids, "command": st.just("true"), "persistent": st.booleans(), "inMs": _small,
    "text": st.text(max_size=30),
}


def _tool_calls(schemas: dict[str, dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """Calls of the listed tools with their own parameters: required ones nearly always there,
    values well-typed most of the time; now and then an unknown tool or an unknown argument."""
    def for_tool(name: str) -> st.SearchStrategy[dict[str, Any]]:
        schema = schemas.get(name, {})
        properties, required = schema.get("properties", {}), set(schema.get("required", []))
        value = {p: st.one_of(TYPED.get(p, _json), TYPED.get(p, _json), TYPED.get(p, _json), _json)
                 for p in properties}
        arguments = st.fixed_dictionaries({p: value[p] for p in properties if p in required},
                                          optional={p: value[p] for p in properties if p not in required})
        odd = st.dictionaries(st.text(max_size=8), _json, max_size=2)
        return st.fixed_dictionaries({
            "jsonrpc": st.just("2.0"), "id": st.integers(1, 10**6), "method": st.just("tools/call"),
            "params": st.fixed_dictionaries({"name": st.just(name), "arguments": arguments | odd})})

    return st.sampled_from([*sorted(schemas), "no_such_tool"]).flatmap(for_tool)


def _harmless(call: dict[str, Any]) -> dict[str, Any]:
    """No generated call may run a shell command or block for long: those are the tools' job,
    not the fuzzer's."""
    arguments = call["params"]["arguments"]
    if "command" in arguments:
        arguments["command"] = "true"
    for key in ("timeoutMs", "inMs"):
        if isinstance(arguments.get(key), int | float) and not isinstance(arguments[key], bool):
            arguments[key] = max(-5, min(arguments[key], 500))
    return call


def test_random_tool_calls_fail_cleanly(target: dict[str, Any]) -> None:
    """Ill-typed, missing or odd arguments to every tool: a JSON-RPC answer, never a 5xx, and
    never an unhandled exception inside a tool (SPEC §5: every failure is {code, message},
    the arguments the schema refuses included)."""
    server = target["server"]
    session = _open_session(server)
    listed = _jsonrpc(_post(server, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, session))
    schemas = {tool["name"]: tool["inputSchema"] for tool in listed[0]["result"]["tools"]}
    assert set(TOOLS) <= set(schemas), sorted(schemas)
    outcomes: dict[str, int] = {}

    @seed(SEED)
    @settings(max_examples=MCP_EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(call=_tool_calls(schemas).map(_harmless))
    def fuzz(call: dict[str, Any]) -> None:
        answer = _post(server, call, session)
        assert answer.status_code < 500, (call, answer.status_code, answer.text[:500])
        [message] = _jsonrpc(answer)
        result = message.get("result")
        if result is None:
            assert isinstance(message["error"]["code"], int), message
            outcomes["jsonrpc error"] = outcomes.get("jsonrpc error", 0) + 1
            return
        if not result.get("isError"):
            outcomes["ok"] = outcomes.get("ok", 0) + 1
            return
        structured = result.get("structuredContent") or {}
        assert isinstance(structured.get("code"), str) and structured.get("message"), (call, result)
        outcomes[structured["code"]] = outcomes.get(structured["code"], 0) + 1

    fuzz()
    note(f"fuzz: {sum(outcomes.values())} random tool calls, outcomes {dict(sorted(outcomes.items()))}")
    assert httpx.get(f"{server.url}/api/health", timeout=10).status_code == 200


def test_random_json_rpc_at_mcp_never_5xx(target: dict[str, Any]) -> None:
    server = target["server"]
    session = _open_session(server)
    statuses: dict[int, int] = {}

    @seed(SEED)
    @settings(max_examples=MCP_EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(body=_requests | _json, in_session=st.booleans())
    def fuzz(body: Any, in_session: bool) -> None:
        answer = _post(server, body, session if in_session else None)
        statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
        assert answer.status_code < 500, (body, answer.status_code, answer.text[:500])

    fuzz()
    note(f"fuzz: {sum(statuses.values())} random JSON-RPC posts to /mcp, "
         f"statuses {dict(sorted(statuses.items()))}")
    listed = _post(server, {"jsonrpc": "2.0", "id": 99, "method": "tools/list"}, session)
    assert listed.status_code == 200, listed.text
    assert httpx.get(f"{server.url}/api/health", timeout=10).status_code == 200


def test_sessions_opened_by_a_link_token_do_not_lock_out_the_admin(module_servers: Any) -> None:
    """One token holder cannot fill the MCP session table: past its cap it gets 429 and
    everyone else still gets in; closing a session frees its place."""
    server = module_servers("sessions").start()
    with server.client() as admin:
        token = admin.post("/api/link-tokens", json={"label": "greedy"}).json()["token"]
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {token}"}
    statuses: dict[int, int] = {}
    sessions: list[str] = []
    counting = threading.Lock()  # eight workers count into one dict
    per_worker = (SESSIONS_PER_TOKEN + 40 if not FULL else 10_400) // 8  # full: past the SDK's own cap

    def open_many(count: int) -> None:
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
            for _ in range(count):
                answer = client.post("/mcp", json=INITIALIZE)
                with counting:
                    statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
                if answer.status_code == 200:
                    sessions.append(answer.headers["mcp-session-id"])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(open_many, [per_worker] * 8))
    note(f"fuzz: a link token opened MCP sessions: {dict(sorted(statuses.items()))}")
    assert statuses == {200: SESSIONS_PER_TOKEN, 429: 8 * per_worker - SESSIONS_PER_TOKEN}, statuses
    answer = _post(server, INITIALIZE)  # the admin
    assert answer.status_code == 200, (answer.status_code, answer.text[:300])
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
        closed = client.request("DELETE", "/mcp", headers={"mcp-session-id": sessions[0]})
        assert closed.status_code in (200, 204), closed.text
        assert client.post("/mcp", json=INITIALIZE).status_code == 200, "a closed session frees its place"
