"""Bad input (G10) and idempotent writes (G9).

Every bad request gets a 4xx in the ``{"error": {"code", "message"}}`` shape, with a
message that says what is wrong, and changes nothing: no event is appended, no thread,
run, message or task appears. The module has its own server so that "no event" is exact.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tether.launch import Server

from .helpers import (
    new_thread,
    noting_parent,
    reply,
    rule,
    script,
    settled_tree,
    sse_events,
    tasks_of,
    thread,
    wait_settled,
)

MB = 1024 * 1024

WEIRD_IDS = [
    "nope",
    "thr_0000000000000000",
    "tsk_0000000000000000",
    "run_0000000000000000",
    "../x",
    "..%2Fx",
    "..%2F..%2Fadmin.token",
    "%2e%2e",
    "%00",
    "x%00y",
    "%ff%fe",
    "%C3%A9t%C3%A9",
    "a%20b",
    "%25",
    "'%3B%20DROP%20TABLE%20threads%3B%20--",
    "%22%7D",
    "null",
    "0",
    "-1",
    "*",
    "~",
    "x" * 5000,
]


def error_of(response: httpx.Response, *statuses: int) -> dict[str, Any]:
    """The response is one of ``statuses`` with a well-formed error body; return the error."""
    assert response.status_code in statuses, (response.status_code, response.text[:300])
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error.get("code"), str) and error["code"]
    assert isinstance(error.get("message"), str) and error["message"]
    return error


@pytest.fixture(scope="module")
def victim(module_server: Server, module_client: httpx.Client) -> dict[str, str]:
    """A parent and its completed task, all settled: targets for requests that must fail."""
    parent_id = new_thread(
        module_client, noting_parent(script(rule("start", reply("FINAL")))), title="victim"
    )
    settled_tree(module_client, parent_id)
    task = tasks_of(module_client, parent_id)[0]
    return {"thread": parent_id, "task": task["taskId"], "child": task["childThreadId"]}


def endpoints(server: Server, victim: dict[str, str]) -> list[tuple[str, str]]:
    """Every documented (method, path) but health, with real ids filled in; plus /mcp."""
    spec = httpx.get(f"{server.url}/openapi.json", headers={"Authorization": f"Bearer {server.token}"}).json()
    found = []
    for path, operations in spec["paths"].items():
        if path == "/api/health":
            continue
        filled = (
            path.replace("{thread_id}", victim["thread"])
            .replace("{task_id}", victim["task"])
            .replace("{token_id}", "tok_0000000000000000")
        )
        found += [(method.upper(), filled) for method in operations]
    found += [
        ("GET", "/mcp"),
        ("POST", "/mcp"),
        ("DELETE", "/mcp"),
        ("GET", "/openapi.json"),
        ("GET", "/docs"),
    ]
    return found


def bad_requests(victim: dict[str, str]) -> list[tuple[str, str, dict[str, Any], tuple[int, ...]]]:
    """(method, path, httpx kwargs, accepted statuses) of requests that must change nothing."""
    t, k = victim["thread"], victim["task"]
    json_headers = {"content-type": "application/json"}
    requests: list[tuple[str, str, dict[str, Any], tuple[int, ...]]] = []
    # Unknown ids.
    for ident in WEIRD_IDS:
        requests += [
            ("GET", f"/api/threads/{ident}", {}, (404,)),
            ("POST", f"/api/threads/{ident}/messages", {"json": {"text": "hi"}}, (404,)),
            ("GET", f"/api/threads/{ident}/wait", {"params": {"timeoutMs": 0}}, (404,)),
            ("POST", f"/api/threads/{ident}/interrupt", {"json": {}}, (404,)),
            ("POST", f"/api/threads/{ident}/credentials", {"json": {}}, (404,)),
            ("GET", f"/api/tasks/{ident}", {}, (404,)),
            ("POST", f"/api/tasks/{ident}/cancel", {"json": {}}, (404,)),
        ]
    # Malformed JSON.
    for path in (
        "/api/threads",
        f"/api/threads/{t}/messages",
        f"/api/tasks/{k}/cancel",
        f"/api/threads/{t}/credentials",
    ):
        for raw in (b"{bad", b'{"provider": "script"', b"\xff\xfe", b'{"text": "x",}'):
            requests.append(("POST", path, {"content": raw, "headers": json_headers}, (400, 422)))
    # Missing or ill-typed fields.
    for body in (
        {},
        {"provider": None},
        {"provider": 1},
        {"provider": ""},
        {"provider": ["script"]},
        {"provider": "script", "message": 5},
        {"provider": "script", "title": {"a": 1}},
        {"provider": "script", "clientRequestId": 7},
        [],
        "script",
        None,
        1,
    ):
        requests.append(("POST", "/api/threads", {"json": body}, (422,)))
    for body in (
        {},
        {"text": ""},
        {"text": None},
        {"text": 1},
        {"text": "x", "mode": "later"},
        {"text": "x", "mode": 1},
        [],
        "hello",
    ):
        requests.append(("POST", f"/api/threads/{t}/messages", {"json": body}, (422,)))
    requests += [
        ("POST", "/api/threads", {"json": {"provider": "no-such-provider", "message": "x"}}, (422,)),
        ("POST", f"/api/tasks/{k}/cancel", {"json": {"reason": 5}}, (422,)),
        ("POST", f"/api/tasks/{k}/cancel", {"json": []}, (422,)),
        ("POST", f"/api/threads/{t}/credentials", {"json": {"ttlSeconds": -1}}, (422,)),
        ("POST", f"/api/threads/{t}/credentials", {"json": {"ttlSeconds": "soon"}}, (422,)),
        ("GET", f"/api/threads/{t}/wait", {"params": {"timeoutMs": -1}}, (422,)),
        ("GET", f"/api/threads/{t}/wait", {"params": {"timeoutMs": "soon"}}, (422,)),
        ("GET", f"/api/threads/{t}/wait", {"params": {"afterRunId": "run_nope", "timeoutMs": 0}}, (422, 404)),
        ("GET", f"/api/threads/{t}/wait", {"params": {"untilSettled": "maybe", "timeoutMs": 0}}, (422,)),
        ("GET", f"/api/threads/{t}/messages", {"params": {"limit": 0}}, (422,)),
        ("GET", "/api/tasks", {"params": {"status": "finished"}}, (422,)),
        # Too large.
        (
            "POST",
            "/api/threads",
            {"content": b'{"provider": "script", "message": "' + b"x" * MB + b'"}', "headers": json_headers},
            (413,),
        ),
        (
            "POST",
            f"/api/threads/{t}/messages",
            {"content": b'{"text": "' + b"x" * (2 * MB) + b'"}', "headers": json_headers},
            (413,),
        ),
    ]
    # No token, and a wrong one.
    for headers in (
        {"Authorization": ""},
        {"Authorization": "Bearer wrong-token"},
        {"Authorization": "Basic YWRtaW46YWRtaW4="},
        {"Authorization": "Bearer"},
    ):
        requests += [
            (
                "POST",
                "/api/threads",
                {"json": {"provider": "script", "message": "x"}, "headers": headers},
                (401,),
            ),
            ("POST", f"/api/threads/{t}/messages", {"json": {"text": "x"}, "headers": headers}, (401,)),
            ("POST", f"/api/tasks/{k}/cancel", {"json": {}, "headers": headers}, (401,)),
            ("POST", f"/api/threads/{t}/interrupt", {"json": {"stop": True}, "headers": headers}, (401,)),
        ]
    return requests


# ---------------------------------------------------------------------------- G10


def test_health_needs_no_token(module_server: Server) -> None:
    health = httpx.get(f"{module_server.url}/api/health")
    assert health.status_code == 200
    assert set(health.json()) >= {"environmentId", "name", "version"}


def test_stats_are_for_the_admin_only(
    module_server: Server, module_client: httpx.Client, victim: dict[str, str]
) -> None:
    stats = module_client.get("/api/stats").json()
    assert stats["transactions"] > 0 and stats["events"] > 0 and stats["cpuSeconds"] > 0
    assert stats["childCpuSeconds"] >= 0
    assert stats["bytesWritten"] > 0  # Linux counts it: at least the store's log
    credential = module_client.post(f"/api/threads/{victim['thread']}/credentials", json={}).json()["token"]
    headers = {"Authorization": f"Bearer {credential}"}
    answer = httpx.get(f"{module_server.url}/api/stats", headers=headers, timeout=10)
    assert error_of(answer, 403)["code"] == "forbidden"


def test_every_endpoint_needs_a_token(module_server: Server, victim: dict[str, str]) -> None:
    listed = endpoints(module_server, victim)
    assert ("POST", "/api/threads") in listed and ("GET", "/api/events") in listed
    with httpx.Client(base_url=module_server.url, timeout=10) as anonymous:
        for method, path in listed:
            for headers in (
                {},
                {"Authorization": "Bearer not-the-token"},
                {"Authorization": "Basic Zm9vOmJhcg=="},
                {"Authorization": "Bearer"},
            ):
                answer = anonymous.request(
                    method, path, headers=headers, json={} if method != "GET" else None
                )
                error = error_of(answer, 401)
                assert error["code"] == "unauthorized", (method, path, error)


@pytest.mark.parametrize("ident", WEIRD_IDS)
def test_unknown_ids_get_404(module_client: httpx.Client, ident: str) -> None:
    for method, path, kwargs in [
        ("GET", f"/api/threads/{ident}", {}),
        ("GET", f"/api/threads/{ident}/wait", {"params": {"timeoutMs": 0}}),
        ("GET", f"/api/threads/{ident}/messages", {}),
        ("POST", f"/api/threads/{ident}/messages", {"json": {"text": "hi"}}),
        ("POST", f"/api/threads/{ident}/interrupt", {"json": {}}),
        ("POST", f"/api/threads/{ident}/credentials", {"json": {}}),
        ("GET", f"/api/tasks/{ident}", {}),
        ("POST", f"/api/tasks/{ident}/cancel", {"json": {}}),
    ]:
        error_of(module_client.request(method, path, **kwargs), 404)


def test_unknown_id_is_named_in_the_message(module_client: httpx.Client) -> None:
    error = error_of(module_client.get("/api/threads/thr_feedfacefeedface"), 404)
    assert "thr_feedfacefeedface" in error["message"]
    error = error_of(module_client.get("/api/tasks/tsk_feedfacefeedface"), 404)
    assert "tsk_feedfacefeedface" in error["message"]


@pytest.mark.parametrize("path", ["/api/threads", "MESSAGES", "CANCEL"])
def test_malformed_json(module_client: httpx.Client, victim: dict[str, str], path: str) -> None:
    path = {
        "MESSAGES": f"/api/threads/{victim['thread']}/messages",
        "CANCEL": f"/api/tasks/{victim['task']}/cancel",
    }.get(path, path)
    for raw in (b"{bad", b'{"text": "x",}', b"\xff\xfe"):
        error_of(
            module_client.post(path, content=raw, headers={"content-type": "application/json"}), 400, 422
        )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "provider"),
        ({"provider": 1}, "provider"),
        ({"provider": ""}, "provider"),
        ({"provider": "script", "message": 5}, "message"),
        ({"provider": "script", "title": ["x"]}, "title"),
        ([], "body"),
    ],
)
def test_create_thread_field_errors(module_client: httpx.Client, body: Any, field: str) -> None:
    error = error_of(module_client.post("/api/threads", json=body), 422)
    assert field in error["message"], error


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "text"),
        ({"text": ""}, "text"),
        ({"text": 3}, "text"),
        ({"text": "x", "mode": "later"}, "mode"),
    ],
)
def test_post_message_field_errors(
    module_client: httpx.Client, victim: dict[str, str], body: Any, field: str
) -> None:
    error = error_of(module_client.post(f"/api/threads/{victim['thread']}/messages", json=body), 422)
    assert field in error["message"], error


def test_unknown_provider(module_client: httpx.Client) -> None:
    error = error_of(module_client.post("/api/threads", json={"provider": "gpt-17", "message": "hi"}), 422)
    assert "gpt-17" in error["message"] and "provider" in error["message"]


def test_body_over_1mb(module_client: httpx.Client, victim: dict[str, str]) -> None:
    big = b'{"provider": "script", "message": "' + b"x" * MB + b'"}'
    error = error_of(
        module_client.post("/api/threads", content=big, headers={"content-type": "application/json"}), 413
    )
    assert error["code"] == "too_large"
    # Just under the limit is fine (the limit is on the body, not on a field).
    under = module_client.post("/api/threads", json={"provider": "script", "message": "y" * (MB - 100)})
    assert under.status_code == 201, under.text[:200]
    wait_settled(module_client, under.json()["threadId"])  # its run fails: not a script


def test_chunked_body_over_1mb(module_client: httpx.Client) -> None:
    def chunks() -> Any:
        yield b'{"provider": "script", "message": "'
        for _ in range(2 * 1024):
            yield b"x" * 1024
        yield b'"}'

    error_of(
        module_client.post("/api/threads", content=chunks(), headers={"content-type": "application/json"}),
        413,
    )


def _feed_refusal(server: Server, params: dict[str, str], headers: dict[str, str] | None = None) -> str:
    """The message of the feed's refusal to start with these parameters."""
    answer = httpx.get(
        f"{server.url}/api/events",
        params=params,
        headers={"Authorization": f"Bearer {server.token}", **(headers or {})},
        timeout=10,
    )
    return str(error_of(answer, 400, 422)["message"])


@pytest.mark.parametrize("cursor", ["abc", "-1", "+1", "1.5", "0x10", "1e3", "now!", "%20"])
def test_bad_event_cursor(module_server: Server, cursor: str) -> None:
    assert "cursor" in _feed_refusal(module_server, {"after": cursor})
    _feed_refusal(module_server, {}, {"Last-Event-ID": cursor})


_BAD_TYPES = ["", "Task.", "task..x", ".task", "task.;x", "t" * 65, ",".join(["task."] * 17)]


@pytest.mark.parametrize("types", _BAD_TYPES)
def test_bad_event_types(module_server: Server, types: str) -> None:
    assert "types" in _feed_refusal(module_server, {"types": types})


def test_the_feed_sends_only_the_types_asked_for(module_server: Server, victim: dict[str, str]) -> None:
    """``?types=``: events of those types (an entry ending in '.' is a prefix), up to the
    newest, and nothing else; a follower of a link reads only ``task.`` events."""
    seen: list[str] = []
    with httpx.stream(
        "GET",
        f"{module_server.url}/api/events",
        params={"after": "0", "types": "task.,thread.created", "keepalive": "0.2"},
        headers={"Authorization": f"Bearer {module_server.token}"},
        timeout=10,
    ) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if line.startswith("event:"):
                seen.append(line[6:].strip())
            elif line == ": keepalive":  # caught up with the newest event
                break
    assert "thread.created" in seen and "task.created" in seen and "task.updated" in seen
    assert all(kind.startswith("task.") or kind == "thread.created" for kind in seen), seen


def test_event_cursor_out_of_range(module_server: Server) -> None:
    with httpx.stream(
        "GET",
        f"{module_server.url}/api/events",
        params={"after": "9" * 30},
        headers={"Authorization": f"Bearer {module_server.token}"},
        timeout=10,
    ) as answer:
        assert 400 <= answer.status_code < 500, answer.status_code


def test_bad_input_changes_nothing(
    module_server: Server, module_client: httpx.Client, victim: dict[str, str]
) -> None:
    client = module_client

    def marker() -> str:
        """A thread with no message: its creation is its only event."""
        created = client.post("/api/threads", json={"provider": "script", "title": f"marker {uuid.uuid4()}"})
        assert created.status_code == 201, created.text
        return created.json()["threadId"]

    def snapshot() -> dict[str, Any]:
        return {
            "threads": {t["threadId"]: t for t in client.get("/api/threads").json()["threads"]},
            "tasks": client.get("/api/tasks").json()["tasks"],
            "victim": thread(client, victim["thread"]),
            "child": thread(client, victim["child"]),
        }

    for known in client.get("/api/threads").json()["threads"]:
        wait_settled(client, known["threadId"])  # earlier tests' threads: all quiet now
    first: list[str] = []
    events = sse_events(
        module_server.url,
        module_server.token,
        "now",
        lambda e: e["type"] == "thread.created" and e["threadId"] in first,
        on_open=lambda: first.append(marker()),
    )
    cursor = events[-1]["id"]
    before = snapshot()

    requests = bad_requests(victim)
    assert len(requests) > 200
    for method, path, kwargs, statuses in requests:
        answer = client.request(method, path, **kwargs)
        error_of(answer, *statuses)

    after = snapshot()
    second: list[str] = []
    between = sse_events(
        module_server.url,
        module_server.token,
        cursor,
        lambda e: e["type"] == "thread.created" and e["threadId"] in second,
        on_open=lambda: second.append(marker()),
    )
    assert [e["type"] for e in between] == ["thread.created"], [(e["type"], e["data"]) for e in between]
    assert after == before
    assert between[0]["threadId"] == second[0]


# ---------------------------------------------------------------------------- G9


def test_create_thread_idempotent(module_client: httpx.Client) -> None:
    client = module_client
    key = f"create-{uuid.uuid4()}"
    body = {
        "provider": "script",
        "title": "idempotent",
        "clientRequestId": key,
        "message": '{"tether_script": 1, "rules": [{"on": "start", "do": [{"reply": "hi"}]}]}',
    }
    count = len(client.get("/api/threads").json()["threads"])
    first = client.post("/api/threads", json=body)
    again = client.post("/api/threads", json=body)
    assert first.status_code == 201 and again.status_code in (200, 201)
    assert again.json() == first.json()
    assert len(client.get("/api/threads").json()["threads"]) == count + 1
    wait_settled(client, first.json()["threadId"])
    assert [r["runId"] for r in thread(client, first.json()["threadId"])["runs"]] == [first.json()["runId"]]
    other = client.post("/api/threads", json={**body, "clientRequestId": f"{key}-other"})
    assert other.json()["threadId"] != first.json()["threadId"], "another key is another thread"


def test_create_thread_idempotent_under_concurrency(
    module_server: Server, module_client: httpx.Client
) -> None:
    key = f"burst-{uuid.uuid4()}"
    count = len(module_client.get("/api/threads").json()["threads"])

    def post(_: int) -> dict[str, Any]:
        with module_server.client() as client:
            answer = client.post("/api/threads", json={"provider": "script", "clientRequestId": key})
            assert answer.status_code in (200, 201), answer.text
            return answer.json()

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(post, range(16)))
    assert all(a == answers[0] for a in answers)
    assert len(module_client.get("/api/threads").json()["threads"]) == count + 1


def test_post_message_idempotent(module_client: httpx.Client) -> None:
    client = module_client
    thread_id = new_thread(client, script(rule("any", reply("ok"), repeat=True)))
    wait_settled(client, thread_id)
    key = f"message-{uuid.uuid4()}"
    first = client.post(f"/api/threads/{thread_id}/messages", json={"text": "hello", "clientRequestId": key})
    again = client.post(f"/api/threads/{thread_id}/messages", json={"text": "hello", "clientRequestId": key})
    assert first.status_code == 200 and again.status_code == 200, (first.text, again.text)
    assert again.json() == first.json()
    assert set(first.json()) >= {"messageId", "runId", "delivery"}
    wait_settled(client, thread_id)
    view = thread(client, thread_id)
    assert len(view["runs"]) == 2
    assert [m["text"] for m in view["messages"] if m["role"] == "user"].count("hello") == 1


def test_message_key_is_per_thread(module_client: httpx.Client) -> None:
    """The same key on another thread is another request (or a clear 409), never a silent no-op."""
    client = module_client
    key = f"shared-key-{uuid.uuid4()}"
    first_id = client.post("/api/threads", json={"provider": "script"}).json()["threadId"]
    second_id = client.post("/api/threads", json={"provider": "script"}).json()["threadId"]
    first = client.post(
        f"/api/threads/{first_id}/messages", json={"text": "to the first", "clientRequestId": key}
    )
    assert first.status_code == 200, first.text
    second = client.post(
        f"/api/threads/{second_id}/messages", json={"text": "to the second", "clientRequestId": key}
    )
    if second.status_code == 409:
        error_of(second, 409)
        return
    assert second.status_code == 200, second.text
    assert second.json()["messageId"] != first.json()["messageId"], "answered with the first thread's message"
    texts = [m["text"] for m in thread(client, second_id)["messages"]]
    assert texts[:1] == ["to the second"]
