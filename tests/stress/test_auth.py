"""Auth (G10): every route of the server's own OpenAPI document — and ``/mcp``,
``/openapi.json``, ``/docs`` — with real ids filled in, refuses a missing, wrong,
malformed, revoked or expired token with 401; and a link token (or a thread credential)
reaches nothing outside its fence: on objects it did not create, every route answers
401/403/404 and changes nothing, and what it may list or stream shows none of them.

The routes are read from ``/openapi.json`` at run time, so a route added later is covered
without touching this file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kit import mint, new_thread, poll

from .stresskit import note, wait_idle

SECRET_ADMIN, SECRET_OTHER = "SECRET-OF-THE-ADMIN", "SECRET-OF-ANOTHER-TOKEN"
EXTRA_ROUTES = [("GET", "/mcp"), ("POST", "/mcp"), ("DELETE", "/mcp"), ("GET", "/openapi.json"),
                ("GET", "/docs"), ("GET", "/.well-known/agent-card.json"), ("POST", "/a2a"),
                ("POST", "/a2a/v1/message:send"), ("GET", "/a2a/v1/tasks")]
OPEN = {("GET", "/api/health"), ("GET", "/.well-known/agent-card.json")}
A2A_MESSAGE = {"message": {"messageId": "intruder-1", "role": "ROLE_USER",
                           "parts": [{"text": json.dumps({"tether_script": 1, "rules": []})}]}}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "auth", "version": "1"}}}


def _replying(text: str) -> dict[str, Any]:
    return {"tether_script": 1, "rules": [{"on": "any", "repeat": True, "do": [{"reply": text}]}]}


def _parent(text: str) -> dict[str, Any]:
    return {"tether_script": 1, "rules": [
        {"on": "start", "do": [{"delegate": {"task": _replying(text), "id": "c", "title": text}},
                               {"reply": text}]},
        {"on": "any", "repeat": True, "do": [{"reply": text}]}]}


def _as(server: Any, token: str | None, **headers: str) -> httpx.Client:
    sent = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=server.url, headers={**sent, **headers}, timeout=30)


def _hand_task(server: Any, token: str, task_id: str, text: str) -> dict[str, Any]:
    """What a linked origin does: hand this environment a task through its link token."""
    with _as(server, token) as client:
        response = client.post("/api/tasks", json={
            "taskId": task_id, "task": json.dumps(_replying(text)), "title": text,
            "origin": {"environmentId": "env_0123456789abcdef", "threadId": "thr_0123456789abcdef"}})
    assert response.status_code == 201, response.text
    return dict(response.json())


@pytest.fixture(scope="module")
def world(module_servers: Any) -> Iterator[dict[str, Any]]:
    """On one server: the admin's parent, task and child; a thread and a handed task of
    another link token; the attacker's own thread and task; an isolated thread with a
    credential; a revoked link token and an expired credential."""
    server = module_servers("auth").start()
    admin_thread = new_thread(server, _parent(SECRET_ADMIN), SECRET_ADMIN)
    other, attacker, revoked = mint(server, "other"), mint(server, "attacker"), mint(server, "revoked")
    other_thread = new_thread(server, _replying(SECRET_OTHER), SECRET_OTHER, token=other["token"])
    other_task = _hand_task(server, other["token"], "tsk_0ther0000000001", SECRET_OTHER)
    own_thread = new_thread(server, _replying("mine"), "mine", token=attacker["token"])
    own_task = _hand_task(server, attacker["token"], "tsk_a77ac0000000001", "mine")
    lonely = new_thread(server, _replying("lonely"), "lonely")
    with server.client() as admin:
        settled = admin.get(f"/api/threads/{admin_thread}/wait",
                            params={"untilSettled": "true", "timeoutMs": 30000})
        assert settled.json()["settled"], settled.text
        admin_task = admin.get("/api/tasks", params={"parentThreadId": admin_thread}).json()["tasks"][0]
        credential = admin.post(f"/api/threads/{lonely}/credentials", json={"ttlSeconds": 3600}).json()
        expiring = admin.post(f"/api/threads/{lonely}/credentials", json={"ttlSeconds": 1}).json()
        assert admin.delete(f"/api/link-tokens/{revoked['tokenId']}").status_code == 200
    for thread_id in (other_thread, other_task["childThreadId"], own_thread, own_task["childThreadId"],
                      lonely, admin_task["childThreadId"]):
        wait_idle(server, thread_id)
    # an expired credential: expiry has no event, so poll (bounded) until it is refused
    poll(lambda: _as(server, expiring["token"]).get(f"/api/threads/{lonely}").status_code == 401, 10,
         "the 1 s credential to expire", interval=0.2)
    yield {
        "server": server,
        "admin": {"thread_id": admin_thread, "task_id": admin_task["taskId"], "token_id": other["tokenId"],
                  "child": admin_task["childThreadId"]},
        "other": {"thread_id": other_thread, "task_id": other_task["taskId"], "token_id": other["tokenId"],
                  "child": other_task["childThreadId"]},
        "own": {"thread_id": own_thread, "task_id": own_task["taskId"], "token_id": attacker["tokenId"]},
        "lonely": lonely,
        "tokens": {"other": other, "attacker": attacker, "revoked": revoked,
                   "credential": credential, "expired": expiring},
    }


# ---------------------------------------------------------------------- routes


def routes(server: Any) -> list[tuple[str, str]]:
    """Every (method, path template) of the OpenAPI document, plus the routes it omits."""
    spec = httpx.get(f"{server.url}/openapi.json", headers={"Authorization": f"Bearer {server.token}"},
                     timeout=30).json()
    found = [(method.upper(), path) for path, operations in spec["paths"].items() for method in operations
             if method in ("get", "post", "put", "patch", "delete")]
    assert len(found) >= 15, found
    return found + EXTRA_ROUTES


def fill(path: str, ids: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        return ids.get(match.group(1), "unknown_id_0000")

    return re.sub(r"\{(\w+)\}", one, path)


def body_for(method: str, path: str, server: Any) -> dict[str, Any] | None:
    """A valid body, so that a refusal is about the token, not the input."""
    if method not in ("POST", "PUT", "PATCH"):
        return None
    bodies = {
        "/api/threads": {"provider": "script", "title": "intruder", "message": json.dumps(_replying("x"))},
        "/api/threads/{thread_id}/messages": {"text": "let me in"},
        "/api/threads/{thread_id}/interrupt": {"stop": True},
        "/api/threads/{thread_id}/credentials": {"ttlSeconds": 60},
        "/api/tasks": {"taskId": "tsk_1ntruder00000001", "task": json.dumps(_replying("x")),
                       "origin": {"environmentId": "env_0123456789abcdef",
                                  "threadId": "thr_0123456789abcdef"}},
        "/api/tasks/{task_id}/cancel": {"reason": "let me in"},
        "/api/link-tokens": {"label": "intruder"},
        "/api/links": {"url": server.url, "token": "ttl_not_a_real_token"},
        "/mcp": INITIALIZE,
        "/a2a": {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": A2A_MESSAGE},
        "/a2a/v1/message:send": A2A_MESSAGE,
    }
    return bodies.get(path, {})


def call(client: httpx.Client, method: str, path: str, body: Any = None, **params: Any) -> httpx.Response:
    """One request; a stream (``/api/events``, an MCP GET) is read only up to its first
    keepalive, so nothing here blocks."""
    headers = MCP_HEADERS if path == "/mcp" else {"A2A-Version": "1.0"} if path.startswith("/a2a") else {}
    if path.startswith("/api/events") or (path == "/mcp" and method == "GET"):
        params = {"after": "0", "keepalive": "0.2", **params} if path.startswith("/api/events") else params
        with client.stream(method, path, params=params, headers=headers) as response:
            chunks = []
            if response.status_code == 200:
                for line in response.iter_lines():
                    chunks.append(line)
                    if line.startswith(": keepalive") or len(chunks) > 100_000:
                        break
            else:
                response.read()
                chunks = [response.text]
        return httpx.Response(response.status_code, headers=response.headers, text="\n".join(chunks))
    return client.request(method, path, json=body, params=params or None, headers=headers)


# ---------------------------------------------------------------------- no token, bad tokens

BAD = ["missing", "wrong", "not bearer", "bearer without a token", "no scheme", "revoked link token",
       "expired credential", "wrong cookie"]


def _bad_client(world: dict[str, Any], kind: str) -> httpx.Client:
    server, tokens = world["server"], world["tokens"]
    headers = {
        "missing": {},
        "wrong": {"Authorization": "Bearer ttl_this_is_not_a_token"},
        "not bearer": {"Authorization": f"Basic {server.token}"},
        "bearer without a token": {"Authorization": "Bearer"},
        "no scheme": {"Authorization": server.token[:-1]},
        "revoked link token": {"Authorization": f"Bearer {tokens['revoked']['token']}"},
        "expired credential": {"Authorization": f"Bearer {tokens['expired']['token']}"},
        "wrong cookie": {"Cookie": "tether_token=tta_wrong"},
    }[kind]
    return httpx.Client(base_url=server.url, headers=headers, timeout=30)


@pytest.mark.parametrize("kind", BAD)
def test_every_route_refuses_a_missing_or_bad_token(world: dict[str, Any], kind: str) -> None:
    server, ids = world["server"], world["admin"]
    before = _snapshot(world)
    wrong = []
    with _bad_client(world, kind) as client:
        for method, template in routes(server):
            path = fill(template, ids)
            response = call(client, method, path, body_for(method, template, server))
            if (method, template) in OPEN:
                if response.status_code != 200:
                    wrong.append(f"{method} {path}: {response.status_code} (must stay open)")
                continue
            if response.status_code != 401:
                wrong.append(f"{method} {path}: {response.status_code} {response.text[:200]}")
            elif "error" not in response.json():
                wrong.append(f"{method} {path}: 401 without an error body: {response.text[:200]}")
    assert not wrong, "\n".join(wrong)
    assert _snapshot(world) == before


# ---------------------------------------------------------------------- the fence


def _snapshot(world: dict[str, Any]) -> dict[str, Any]:
    """The objects the intruder must not touch, as the admin sees them."""
    server = world["server"]
    with server.client() as admin:
        found: dict[str, Any] = {}
        for owner in ("admin", "other"):
            for key in ("thread_id", "child"):
                view = admin.get(f"/api/threads/{world[owner][key]}").json()
                found[f"{owner} {key}"] = (view["runs"], view["messages"], view["background"])
            found[f"{owner} task"] = admin.get(f"/api/tasks/{world[owner]['task_id']}").json()
        found["tokens"] = admin.get("/api/link-tokens").json()["tokens"]
        for token in found["tokens"]:
            token.pop("lastUsedAt", None)  # the intruder's own token is used, of course
            token.pop("ackedEventId", None)
    return found


def _foreign_marks(world: dict[str, Any]) -> set[str]:
    marks = {SECRET_ADMIN, SECRET_OTHER, world["server"].token, world["tokens"]["other"]["token"]}
    with world["server"].client() as admin:
        for owner in ("admin", "other"):
            marks |= {world[owner]["thread_id"], world[owner]["task_id"], world[owner]["child"]}
            for key in ("thread_id", "child"):
                view = admin.get(f"/api/threads/{world[owner][key]}").json()
                marks |= {r["runId"] for r in view["runs"]} | {m["messageId"] for m in view["messages"]}
    return marks


FENCED = ["link token", "thread credential"]


def _fenced_token(world: dict[str, Any], who: str) -> tuple[str, dict[str, str]]:
    """The intruder's token and its own ids (the positive control)."""
    if who == "link token":
        return world["tokens"]["attacker"]["token"], world["own"]
    own = {"thread_id": world["lonely"], "task_id": "none", "token_id": "none"}
    return world["tokens"]["credential"]["token"], own


@pytest.mark.parametrize("who", FENCED)
def test_a_fenced_token_reaches_nothing_outside_its_fence(world: dict[str, Any], who: str) -> None:
    server = world["server"]
    token, own = _fenced_token(world, who)
    before = _snapshot(world)
    marks = _foreign_marks(world)
    with server.client() as admin:  # the leak check is not vacuous: the admin does see them
        assert {SECRET_ADMIN, SECRET_OTHER} <= {m for m in marks if m in admin.get("/api/threads").text}
    wrong, reached = [], 0
    with _as(server, token) as client:
        for method, template in routes(server):
            body = body_for(method, template, server)
            if "{" not in template:
                # no object named: allowed or refused, but nobody else's data in the answer
                response = call(client, method, template, body)
                if response.status_code >= 500:
                    wrong.append(f"{method} {template}: {response.status_code} {response.text[:200]}")
                leaked = {m for m in marks if m in response.text}
                if 200 <= response.status_code < 300 and leaked:
                    wrong.append(f"{method} {template}: {response.status_code} shows {sorted(leaked)}")
                continue
            for owner in ("admin", "other"):
                path = fill(template, world[owner])
                response = call(client, method, path, body)
                reached += 1
                if response.status_code not in (401, 403, 404):
                    wrong.append(f"{method} {path} ({owner}'s): {response.status_code} {response.text[:200]}")
            if method == "GET" and all(f"{{{p}}}" not in template or own.get(p, "none") != "none"
                                       for p in ("thread_id", "task_id", "token_id")):
                # the control: the same route on the intruder's own object is not refused
                response = call(client, method, fill(template, own), body, timeoutMs=0)
                if response.status_code != 200:
                    wrong.append(f"control {method} {template} on its own object: {response.status_code}")
        # ids in query parameters
        for path, params in [
            ("/api/tasks", {"parentThreadId": world["admin"]["thread_id"]}),
            ("/api/tasks", {"parentThreadId": world["other"]["thread_id"]}),
            (f"/api/threads/{own['thread_id']}/wait", {"afterRunId": _a_run(world), "timeoutMs": 0}),
        ]:
            response = call(client, "GET", path, **params)
            leaked = {m for m in marks if m in response.text}
            if response.status_code >= 500 or (200 <= response.status_code < 300 and leaked):
                wrong.append(f"GET {path} {params}: {response.status_code} shows {sorted(leaked)}")
    assert not wrong, "\n".join(wrong)
    assert _snapshot(world) == before, "a refused call changed something"
    note(f"auth: a {who} was refused {reached} calls on others' objects")


def _a_run(world: dict[str, Any]) -> str:
    with world["server"].client() as admin:
        return str(admin.get(f"/api/threads/{world['admin']['thread_id']}").json()["runs"][0]["runId"])


def test_a_link_token_cannot_claim_a_foreign_task_id(world: dict[str, Any]) -> None:
    """Handing a task under an id another token's task already has must neither take it
    over nor tell the intruder that it exists: the same answer as for any foreign id."""
    server = world["server"]
    before = _snapshot(world)
    with _as(server, world["tokens"]["attacker"]["token"]) as client:
        response = client.post("/api/tasks", json={**body_for("POST", "/api/tasks", server),
                                                   "taskId": world["other"]["task_id"]})
    assert response.status_code != 201 and not 200 <= response.status_code < 300, response.text
    assert SECRET_OTHER not in response.text
    assert _snapshot(world) == before
    assert response.status_code in (401, 403, 404), (
        f"{response.status_code}: the answer tells a foreign task id from an unknown one ({response.text})")


@pytest.mark.parametrize("victim", ["admin", "other"])
def test_a_link_token_cannot_make_a_foreign_thread_a_parent(world: dict[str, Any], victim: str) -> None:
    """The origin of a link call is trusted only inside the token's fence (SPEC §1): it may
    not name a local thread the token did not create as the parent of its child."""
    server = world["server"]
    token = world["tokens"]["attacker"]["token"]
    here = httpx.get(f"{server.url}/api/health", timeout=10).json()["environmentId"]
    # a victim of its own, so that the shared world stays clean whatever happens here
    owner_token = None if victim == "admin" else world["tokens"]["other"]["token"]
    target = new_thread(server, _replying(SECRET_ADMIN), f"{victim}'s victim", token=owner_token)
    wait_idle(server, target)
    with server.client() as admin:
        before = admin.get(f"/api/threads/{target}").json()
    origin = {"environmentId": here, "threadId": target}
    wait = {"untilSettled": "true", "timeoutMs": 30000}
    with _as(server, token) as client:
        handed = client.post("/api/tasks", json={
            "taskId": f"tsk_0r1g1n{victim}0000", "task": json.dumps(_replying("INJECTED")), "origin": origin})
        if handed.status_code == 201:
            child = handed.json()["childThreadId"]
            settled = client.get(f"/api/threads/{child}/wait", params=wait)
            assert settled.status_code == 200 and settled.json()["settled"], settled.text
            sent = client.post(f"/api/threads/{child}/messages", json={"text": "again", "origin": origin})
            assert sent.status_code < 500, sent.text
            client.get(f"/api/threads/{child}/wait", params=wait)
        else:
            assert handed.status_code in (400, 403, 404, 422), handed.text
    wait_idle(server, target)
    with server.client() as admin:
        after = admin.get(f"/api/threads/{target}").json()
    injected = [m["text"] for m in after["messages"] if "INJECTED" in m["text"]]
    assert not injected, f"the {victim}'s thread got: {injected}"
    assert (after["runs"], after["messages"]) == (before["runs"], before["messages"])


def test_idempotency_keys_are_per_caller(world: dict[str, Any]) -> None:
    """A clientRequestId the admin used does not hand the intruder the admin's thread."""
    server = world["server"]
    body = {"provider": "script", "title": SECRET_ADMIN, "message": json.dumps(_replying(SECRET_ADMIN)),
            "clientRequestId": "shared-key-0001"}
    with server.client() as admin:
        first = admin.post("/api/threads", json=body)
    assert first.status_code == 201, first.text
    with _as(server, world["tokens"]["attacker"]["token"]) as client:
        second = client.post("/api/threads", json={**body, "title": "mine"})
    assert second.status_code in (201, 401, 403, 409), second.text
    assert second.json().get("threadId") != first.json()["threadId"], "the intruder got the admin's thread"


# ---------------------------------------------------------------------- the tools, over MCP


def _mcp(server: Any, token: str) -> tuple[httpx.Client, str]:
    client = _as(server, token, **MCP_HEADERS)
    opened = client.post("/mcp", json=INITIALIZE)
    assert opened.status_code == 200, opened.text
    session = opened.headers["mcp-session-id"]
    client.headers["mcp-session-id"] = session
    client.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    return client, session


def _tool(client: httpx.Client, name: str, arguments: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    response = client.post("/mcp", json={"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                                         "params": {"name": name, "arguments": arguments}})
    if response.status_code != 200:
        return response.status_code, {}
    lines = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
    message = json.loads(lines[-1] if lines else response.text)
    return response.status_code, message.get("result") or {"error": message.get("error")}


@pytest.mark.parametrize("who", FENCED)
def test_the_tools_stay_inside_the_fence(world: dict[str, Any], who: str) -> None:
    server = world["server"]
    token, _ = _fenced_token(world, who)
    marks = _foreign_marks(world)
    before = _snapshot(world)
    wrong = []
    client, _session = _mcp(server, token)
    try:
        for owner in ("admin", "other"):
            thread_id, task_id = world[owner]["thread_id"], world[owner]["task_id"]
            for name, arguments in [
                ("thread_read", {"threadId": thread_id}),
                ("thread_read", {"threadId": world[owner]["child"]}),
                ("thread_send", {"threadId": thread_id, "message": "let me in"}),
                ("thread_wait", {"threadId": thread_id, "timeoutMs": 0}),
                ("thread_interrupt", {"threadId": thread_id, "stop": True}),
                ("task_status", {"taskId": task_id}),
                ("task_cancel", {"taskId": task_id, "reason": "let me in"}),
                ("background_wait", {"id": "b1"}),
            ]:
                status, result = _tool(client, name, arguments)
                # the refusal may name the id the caller gave; nothing else of the owner's
                leaked = {m for m in marks - set(arguments.values()) if m in json.dumps(result)}
                if status >= 500 or not result.get("isError") or leaked:
                    wrong.append(f"{name} {arguments}: {status} {json.dumps(result)[:300]}")
        for name in ("thread_list", "environment_links"):
            status, result = _tool(client, name, {})
            leaked = {m for m in marks if m in json.dumps(result)}
            if status >= 500 or leaked:
                wrong.append(f"{name}: {status} shows {sorted(leaked)}")
    finally:
        client.close()
    assert not wrong, "\n".join(wrong)
    assert _snapshot(world) == before
