"""A2A serving (SPEC §14), driven by the official ``a2a-sdk`` client against a real ``tether
serve``: the card, Bearer auth and the fence, probe 1 over A2A (WAITING as the task, FINAL as
a follow-up task in the same context that references it, exactly once — also across a
SIGKILL), ``return_immediately``, cancel, and bad requests answered with A2A error codes
that change nothing."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import Client, ClientConfig, create_client
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import (
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)

from tether.launch import Server, free_port

from .helpers import await_state, new_thread, reply, rule, script, tasks_of

COMPLETED, CANCELED = pb.TaskState.TASK_STATE_COMPLETED, pb.TaskState.TASK_STATE_CANCELED
OPEN = (pb.TaskState.TASK_STATE_SUBMITTED, pb.TaskState.TASK_STATE_WORKING)


def probe_1(seconds: float = 1) -> dict[str, Any]:
    """Probe 1: a background command outlives the first run (WAITING); FINAL on its end."""
    return script(
        rule(
            "start", {"bash": f"sleep {seconds}; echo OK", "background": True, "id": "b1"}, reply("WAITING")
        ),
        rule("background_command", reply("FINAL")),
    )


def message(text: str | dict[str, Any], message_id: str, **fields: Any) -> pb.Message:
    body = text if isinstance(text, str) else json.dumps(text)
    return pb.Message(message_id=message_id, role=pb.Role.ROLE_USER, parts=[pb.Part(text=body)], **fields)


@asynccontextmanager
async def a2a(
    server: Server, token: str | None = None, binding: str = "JSONRPC", streaming: bool = False
) -> AsyncIterator[Client]:
    """The SDK's client, found through the agent card, with a Bearer token."""
    headers = {"Authorization": f"Bearer {token or server.token}"}
    async with httpx.AsyncClient(headers=headers, timeout=90) as http:
        config = ClientConfig(streaming=streaming, httpx_client=http, supported_protocol_bindings=[binding])
        client = await create_client(server.url, config)
        yield client


async def send(client: Client, msg: pb.Message, return_immediately: bool = False) -> pb.Task:
    request = pb.SendMessageRequest(message=msg)
    request.configuration.return_immediately = return_immediately
    return await send_request(client, request)


async def send_request(client: Client, request: pb.SendMessageRequest) -> pb.Task:
    answers = [answer async for answer in client.send_message(request)]
    assert len(answers) == 1 and answers[0].HasField("task"), answers
    return answers[0].task


def text_of(task: pb.Task) -> list[str]:
    return [part.text for artifact in task.artifacts for part in artifact.parts]


async def context_tasks(client: Client, context_id: str) -> list[pb.Task]:
    found = await client.list_tasks(pb.ListTasksRequest(context_id=context_id, include_artifacts=True))
    return list(found.tasks)


def await_follow_up(server: Server, original: pb.Task) -> None:
    """Until the context's follow-up completed (the tether view: its parent is the context)."""

    def done() -> bool:
        with server.client() as api:
            found = tasks_of(api, original.context_id)
        return len(found) > 1 and all(task["status"] == "completed" for task in found)

    await_state(server, done, what=f"the follow-up of {original.id}")


def assert_late_answer_once(tasks: list[pb.Task], original: pb.Task) -> None:
    """The original ends with WAITING; FINAL is one new task referencing it (G1 over A2A)."""
    assert tasks[0].id == original.id
    assert text_of(tasks[0]) == ["WAITING"] and tasks[0].status.state == COMPLETED
    follow_ups = tasks[1:]
    assert len(follow_ups) == 1, [text_of(t) for t in tasks]
    late = follow_ups[0]
    assert late.context_id == original.context_id and late.status.state == COMPLETED
    assert text_of(late) == ["FINAL"]
    assert list(late.status.message.reference_task_ids) == [original.id]
    assert list(late.history[0].reference_task_ids) == [original.id]
    assert late.metadata["tether.followUpOf"] == original.id


# ---------------------------------------------------------------------------- card and auth


def test_card_is_public_and_every_call_needs_a_token(module_server: Server) -> None:
    card = httpx.get(f"{module_server.url}/.well-known/agent-card.json")
    assert card.status_code == 200, card.text
    body = card.json()
    assert body["name"] == "module"
    interfaces = {(i["protocolBinding"], i["protocolVersion"]): i["url"] for i in body["supportedInterfaces"]}
    for version in ("1.0", "0.3"):
        assert interfaces[("JSONRPC", version)] == f"{module_server.url}/a2a"
        assert interfaces[("HTTP+JSON", version)] == f"{module_server.url}/a2a/v1"
    assert body["url"] == f"{module_server.url}/a2a"  # where a 0.3 client looks
    assert "script" in {skill["id"] for skill in body["skills"]}
    assert body["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}}
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        answer = httpx.post(f"{module_server.url}/a2a", json=rpc, headers=headers)
        assert answer.status_code == 401 and answer.headers["www-authenticate"] == "Bearer", answer.text
        assert httpx.get(f"{module_server.url}/a2a/v1/tasks", headers=headers).status_code == 401
    with module_server.client() as api:
        thread_id = new_thread(api, script(rule("start", reply("hi"))))
        credential = api.post(f"/api/threads/{thread_id}/credentials").json()["token"]
    answer = httpx.post(
        f"{module_server.url}/a2a", json=rpc, headers={"Authorization": f"Bearer {credential}"}
    )
    assert answer.status_code == 403, answer.text


# ---------------------------------------------------------------------------- the late answer


async def test_probe_1_over_a2a_late_answer_is_a_follow_up_task(module_server: Server) -> None:
    async with a2a(module_server) as client:
        original = await send(client, message(probe_1(), "probe-1"))
        assert original.status.state == COMPLETED, original
        assert text_of(original) == ["WAITING"]
        await_follow_up(module_server, original)
        tasks = await context_tasks(client, original.context_id)
        assert_late_answer_once(tasks, original)
        late = await client.get_task(pb.GetTaskRequest(id=tasks[1].id))
        assert text_of(late) == ["FINAL"]
        assert (await client.get_task(pb.GetTaskRequest(id=original.id))).status.state == COMPLETED
    with module_server.client() as api:  # the same tasks in tether's own API and web page
        found = {t["taskId"]: t for t in tasks_of(api, original.context_id)}
        assert found[late.id]["followUpOf"] == original.id and found[late.id]["parentEnvironmentId"] == "a2a"
        child = found[original.id]["childThreadId"]
        assert api.get(f"/threads/{child}").status_code == 200


async def test_a_message_to_the_context_goes_to_the_thread_and_answers_as_a_follow_up(
    module_server: Server,
) -> None:
    echo = script(rule("start", reply("READY")), rule("message", reply("got {{text}}"), repeat=True))
    async with a2a(module_server, binding="HTTP+JSON") as client:
        first = await send(client, message(echo, "echo-1"))
        assert text_of(first) == ["READY"]
        again = await send(client, message("ping", "echo-2", context_id=first.context_id))
        assert again.id != first.id and again.context_id == first.context_id
        assert text_of(again) == ["got ping"] and list(again.status.message.reference_task_ids) == [first.id]
        repeated = await send(client, message("ping", "echo-2", context_id=first.context_id))
        assert repeated.id == again.id  # the same message id is one message (G9)
        assert len(await context_tasks(client, first.context_id)) == 2


def results(events: list[pb.StreamResponse]) -> list[tuple[str, str]]:
    """(task id, result text) of every result a stream carried, in whole tasks or updates."""
    found = [(e.task.id, text) for e in events if e.HasField("task") for text in text_of(e.task)]
    updates = [e.artifact_update for e in events if e.HasField("artifact_update")]
    return found + [(u.task_id, part.text) for u in updates for part in u.artifact.parts]


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
async def test_a_stream_carries_the_late_answer_and_a_resubscribe_gets_it_again(
    module_server: Server, binding: str
) -> None:
    async with a2a(module_server, binding=binding, streaming=True) as client:
        request = pb.SendMessageRequest(message=message(probe_1(), f"stream-{binding}"))
        events = [event async for event in client.send_message(request)]  # ends once nothing can answer
        original, late = [event.task for event in events if event.HasField("task")]
        assert late.metadata["tether.followUpOf"] == original.id and late.context_id == original.context_id
        assert sorted(results(events)) == sorted([(original.id, "WAITING"), (late.id, "FINAL")])
        statuses = [late.status] + [
            e.status_update.status
            for e in events
            if e.HasField("status_update") and e.status_update.task_id == late.id
        ]
        assert statuses[-1].state == COMPLETED
        assert list(statuses[-1].message.reference_task_ids) == [original.id]
        again = [event async for event in client.subscribe(pb.SubscribeToTaskRequest(id=original.id))]
        assert [event.task.id for event in again] == [original.id, late.id]
        assert results(again) == [(original.id, "WAITING"), (late.id, "FINAL")]


def subscribe_raw(
    server: Server, task_id: str, last_event_id: str | None = None, limit: int = 0
) -> list[Any]:
    """SubscribeToTask over plain HTTP, to see the SSE ids: ``(id, StreamResponse dict)``
    pairs until the stream ends (or ``limit`` arrived)."""
    headers = {"A2A-Version": "1.0"} | ({"Last-Event-ID": last_event_id} if last_event_id else {})
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "SubscribeToTask", "params": {"id": task_id}}
    found: list[Any] = []
    with server.client() as api, api.stream("POST", "/a2a", json=rpc, headers=headers) as answer:
        assert answer.status_code == 200
        event_id = None
        for line in answer.iter_lines():
            if line.startswith("id:"):
                event_id = line.removeprefix("id:").strip()
            elif line.startswith("data:"):
                found.append((event_id, json.loads(line.removeprefix("data:"))["result"]))
                if len(found) == limit:
                    break
    return found


async def test_a_resubscribe_with_last_event_id_gets_only_what_it_missed(server: Server) -> None:
    """The late answer waits for a file the test creates: no timing decides what is missed."""
    gate = server.data / "workspace" / "go"
    child = script(
        rule("start", {"bash": "until [ -e go ]; do sleep 0.1; done", "background": True}, reply("WAITING")),
        rule("background_command", reply("FINAL")),
    )
    async with a2a(server) as client:
        original = await send(client, message(child, "resume-1"))
    [(first_id, first)] = subscribe_raw(server, original.id, limit=1)  # then the client goes away
    assert first["task"]["id"] == original.id and first_id and first_id.isdigit()
    gate.touch()
    await_follow_up(server, original)
    missed = subscribe_raw(server, original.id, last_event_id=first_id)
    assert all(event_id and int(event_id) > int(first_id) for event_id, _ in missed)
    late = [body["task"] for _, body in missed if body.get("task", {}).get("id") != original.id]
    assert len(late) == 1 and late[0]["metadata"]["tether.followUpOf"] == original.id
    assert late[0]["artifacts"][0]["parts"][0]["text"] == "FINAL"
    assert subscribe_raw(server, original.id, last_event_id=missed[-1][0]) == []  # nothing since


async def test_survives_sigkill_and_the_late_answer_still_arrives_once(server: Server) -> None:
    async with a2a(server) as client:
        original = await send(client, message(probe_1(3), "probe-kill"))
        assert text_of(original) == ["WAITING"]
    server.kill()
    server.start()
    async with a2a(server) as client:
        assert text_of(await client.get_task(pb.GetTaskRequest(id=original.id))) == ["WAITING"]
        await_follow_up(server, original)
        assert_late_answer_once(await context_tasks(client, original.context_id), original)


# ---------------------------------------------------------------------------- immediate, cancel


async def test_return_immediately_then_cancel(module_server: Server) -> None:
    slow = script(rule("start", {"sleep_ms": 30_000}, reply("LATE")))
    async with a2a(module_server) as client:
        task = await send(client, message(slow, "slow-1"), return_immediately=True)
        assert task.status.state in OPEN, task
        cancelled = await client.cancel_task(pb.CancelTaskRequest(id=task.id))
        assert cancelled.status.state == CANCELED
        with pytest.raises(TaskNotCancelableError):
            await client.cancel_task(pb.CancelTaskRequest(id=task.id))
        assert (await client.get_task(pb.GetTaskRequest(id=task.id))).status.state == CANCELED
        with module_server.client() as api:
            assert api.get(f"/api/tasks/{task.id}").json()["status"] == "cancelled"


async def test_a_failed_child_is_a_failed_task_with_its_error(module_server: Server) -> None:
    async with a2a(module_server) as client:
        task = await send(client, message(script(rule("start", {"fail": "the build broke"})), "fail-1"))
    assert task.status.state == pb.TaskState.TASK_STATE_FAILED
    assert [part.text for part in task.status.message.parts] == ["the build broke"]
    assert list(task.artifacts) == []


def test_a2a_0_3_clients_blocking_false_answers_at_once(module_server: Server) -> None:
    slow = script(rule("start", {"sleep_ms": 30_000}, reply("LATE")))
    params = {
        "message": {
            "kind": "message",
            "messageId": "v03-1",
            "role": "user",
            "parts": [{"kind": "text", "text": json.dumps(slow)}],
        },
        "configuration": {"blocking": False},
    }
    with module_server.client() as api:
        rpc = {"jsonrpc": "2.0", "id": 7, "method": "message/send", "params": params}
        answer = api.post("/a2a", json=rpc)
        assert answer.status_code == 200, answer.text
        result = answer.json()["result"]
        assert result["kind"] == "task" and result["status"]["state"] in ("submitted", "working"), result
        assert api.post(f"/api/tasks/{result['id']}/cancel").json()["status"] == "cancelled"
        proto = {  # 0.3 HTTP+JSON speaks the 0.3 protobuf's JSON, at {url}/v1/…
            "message": {"messageId": "v03-2", "role": "ROLE_USER", "content": [{"text": json.dumps(slow)}]},
            "configuration": {"blocking": False},
        }
        rest = api.post("/a2a/v1/v1/message:send", json=proto)
        assert rest.status_code == 200, rest.text
        task = rest.json()["task"]
        assert task["status"]["state"] in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"), task
        assert api.post(f"/api/tasks/{task['id']}/cancel").json()["status"] == "cancelled"


# ---------------------------------------------------------------------------- the fence, bad input


async def test_a_link_token_sees_only_its_own_tasks(module_server: Server) -> None:
    with module_server.client() as api:
        token = api.post("/api/link-tokens", json={"label": "a2a-peer"}).json()["token"]
    quick = script(rule("start", reply("DONE")))
    async with a2a(module_server) as admin, a2a(module_server, token) as peer:
        mine = await send(peer, message(quick, "fence-peer"))
        theirs = await send(admin, message(quick, "fence-admin"))
        listed = {t.id for t in (await peer.list_tasks(pb.ListTasksRequest())).tasks}
        assert mine.id in listed and theirs.id not in listed
        assert theirs.id in {t.id for t in (await admin.list_tasks(pb.ListTasksRequest())).tasks}
        with pytest.raises(TaskNotFoundError):
            await peer.get_task(pb.GetTaskRequest(id=theirs.id))
        with pytest.raises(TaskNotFoundError):
            await peer.cancel_task(pb.CancelTaskRequest(id=theirs.id))
        with pytest.raises(TaskNotFoundError):
            await send(peer, message("hello", "fence-into", context_id=theirs.context_id))
        async with a2a(module_server, token, streaming=True) as streaming:
            with pytest.raises(TaskNotFoundError):
                _ = [event async for event in streaming.subscribe(pb.SubscribeToTaskRequest(id=theirs.id))]
        with pytest.raises(TaskNotFoundError):
            await peer.list_task_push_notification_configs(
                pb.ListTaskPushNotificationConfigsRequest(task_id=theirs.id)
            )
        assert len(await context_tasks(admin, theirs.context_id)) == 1


async def test_a_stream_ends_when_its_link_token_is_revoked(module_server: Server) -> None:
    with module_server.client() as api:
        minted = api.post("/api/link-tokens", json={"label": "a2a-revoked"}).json()
    slow = script(rule("start", {"sleep_ms": 60_000}, reply("LATE")))
    async with a2a(module_server, minted["token"], streaming=True) as peer:
        stream = peer.send_message(pb.SendMessageRequest(message=message(slow, "revoked-1")))
        first = await anext(stream)
        assert first.task.status.state in OPEN
        with module_server.client() as api:
            assert api.delete(f"/api/link-tokens/{minted['tokenId']}").status_code == 200
        rest = [event async for event in stream]  # ends by itself, well before the task would
        assert all(not e.HasField("status_update") or e.status_update.status.state in OPEN for e in rest)
    answer = httpx.get(
        f"{module_server.url}/a2a/v1/tasks", headers={"Authorization": f"Bearer {minted['token']}"}
    )
    assert answer.status_code == 401
    with module_server.client() as api:
        api.post(f"/api/tasks/{first.task.id}/cancel")


async def test_bad_requests_get_a2a_errors_and_change_nothing(module_server: Server) -> None:
    async with a2a(module_server) as client:
        before = (await client.list_tasks(pb.ListTasksRequest())).total_size
        empty = pb.Message(message_id="bad-1", role=pb.Role.ROLE_USER, parts=[pb.Part(text="  ")])
        with pytest.raises(InvalidParamsError):
            await send(client, empty)
        unknown = message("hi", "bad-2")
        unknown.metadata.update({"tether.provider": "nonesuch"})
        with pytest.raises(InvalidParamsError):
            await send(client, unknown)
        with pytest.raises(TaskNotFoundError):
            await client.get_task(pb.GetTaskRequest(id="tsk_nonesuch"))
        with pytest.raises(TaskNotFoundError):
            await send(client, message("hi", "bad-3", task_id="tsk_nonesuch"))
        done = await send(client, message(script(rule("start", reply("DONE"))), "bad-4"))
        with pytest.raises(UnsupportedOperationError):
            await send(client, message("more", "bad-5", task_id=done.id))
        with pytest.raises(InvalidParamsError):
            await client.list_tasks(pb.ListTasksRequest(page_size=1000))
        assert (await client.list_tasks(pb.ListTasksRequest())).total_size == before + 1
        assert len(await context_tasks(client, done.context_id)) == 1
    with module_server.client() as api:
        unknown_method = api.post("/a2a", json={"jsonrpc": "2.0", "id": 1, "method": "Nope", "params": {}})
        assert unknown_method.json()["error"]["code"] == -32601
        broken = api.post("/a2a", content=b"{not json", headers={"Content-Type": "application/json"})
        assert broken.json()["error"]["code"] == -32700


# ---------------------------------------------------------------------------- push notifications


class Receiver:
    """A loopback webhook that answers 500 to the first attempt of each delivery and 200 to
    the next: only a sender that tries again gets anything through."""

    def __init__(self) -> None:
        #: While down, every call gets 500 (a receiver that is away).
        self.down = False
        self.refused: set[str] = set()
        #: The deliveries refused while down.
        self.missed: set[str] = set()
        self.received: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.changed = threading.Condition()

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        body = json.loads(request.rfile.read(int(request.headers["Content-Length"])))
        key = request.headers["X-Tether-Delivery"]
        with self.changed:
            failing = self.down or key not in self.refused
            if failing:
                self.refused.add(key)
            if self.down:
                self.missed.add(key)
            else:
                self.received.append((dict(request.headers), body))
            self.changed.notify_all()
        request.send_response(500 if failing else 200)
        request.send_header("Content-Length", "0")
        request.end_headers()

    def wait_for(self, check: Any, timeout: float = 60) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: check(self.received), timeout), self.received


@contextmanager
def receiver() -> Iterator[tuple[Receiver, str]]:
    found = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            found.handle(self)

        def log_message(self, *args: Any) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        yield found, f"http://127.0.0.1:{http.server_address[1]}/hook"
    finally:
        http.shutdown()
        thread.join()


@pytest.fixture
def webhook_server(tmp_path: Path) -> Iterator[Server]:
    """A server whose config allows loopback webhooks (the receiver is on loopback)."""
    data = tmp_path / "push"
    data.mkdir()
    (data / "config.toml").write_text("[a2a]\nallow_private_webhooks = true\n")
    server = Server(data, "push").start(timeout=60)
    yield server
    server.stop()


def pushed(received: list[tuple[dict[str, str], dict[str, Any]]]) -> dict[str, list[str]]:
    """Per task id: the results its pushes carried, in order."""
    found: dict[str, list[str]] = {}
    for _, body in received:
        task = body["task"]
        texts = [part["text"] for artifact in task.get("artifacts", []) for part in artifact["parts"]]
        found.setdefault(task["id"], []).extend(texts)
    return found


async def test_push_notifications_carry_the_late_answer_through_failures(webhook_server: Server) -> None:
    with receiver() as (hook, url):
        async with a2a(webhook_server) as client:
            request = pb.SendMessageRequest(message=message(probe_1(), "push-1"))
            config = request.configuration.task_push_notification_config
            config.url, config.token = url, "secret-1"
            original = await send_request(client, request)
            assert text_of(original) == ["WAITING"]
            configs = await client.list_task_push_notification_configs(
                pb.ListTaskPushNotificationConfigsRequest(task_id=original.id)
            )
            assert [c.url for c in configs.configs] == [url]
            await_follow_up(webhook_server, original)
            late = (await context_tasks(client, original.context_id))[1]
        hook.wait_for(lambda got: "FINAL" in pushed(got).get(late.id, []))
        hook.wait_for(lambda got: "WAITING" in pushed(got).get(original.id, []))
        assert all(headers["X-A2A-Notification-Token"] == "secret-1" for headers, _ in hook.received)
        final = [body["task"] for _, body in hook.received if body["task"]["id"] == late.id][-1]
        assert final["status"]["message"]["referenceTaskIds"] == [original.id]


async def test_webhooks_on_private_addresses_are_refused(module_server: Server) -> None:
    async with a2a(module_server) as client:
        task = await send(client, message(script(rule("start", reply("DONE"))), "ssrf-1"))
        for url in ("http://127.0.0.1:9/hook", "http://10.0.0.1/hook", "file:///etc/passwd"):
            with pytest.raises(InvalidParamsError):
                await client.create_task_push_notification_config(
                    pb.TaskPushNotificationConfig(task_id=task.id, url=url)
                )
        request = pb.SendMessageRequest(message=message("hi", "ssrf-2"))
        request.configuration.task_push_notification_config.url = "http://169.254.169.254/latest"
        with pytest.raises(InvalidParamsError):
            await send_request(client, request)
        listed = await client.list_task_push_notification_configs(
            pb.ListTaskPushNotificationConfigsRequest(task_id=task.id)
        )
        assert list(listed.configs) == []
        with module_server.client() as api:
            assert not [t for t in api.get("/api/tasks").json()["tasks"] if t["title"] == "ssrf-2"]


async def test_pushes_refused_before_a_sigkill_arrive_after_the_restart(webhook_server: Server) -> None:
    with receiver() as (hook, url):
        hook.down = True
        async with a2a(webhook_server) as client:
            request = pb.SendMessageRequest(message=message(probe_1(3), "push-kill"))
            request.configuration.task_push_notification_config.url = url
            original = await send_request(client, request)
        with hook.changed:  # a delivery was tried (and refused) before the kill, not after
            assert hook.changed.wait_for(lambda: hook.missed, 60)
        webhook_server.kill()  # with deliveries pending: refused so far, kept in the outbox
        with hook.changed:
            hook.down = False
            missed = set(hook.missed)
        assert missed
        webhook_server.start(timeout=60)
        await_follow_up(webhook_server, original)
        async with a2a(webhook_server) as client:
            late = (await context_tasks(client, original.context_id))[1]
        hook.wait_for(lambda got: "FINAL" in pushed(got).get(late.id, []))
        hook.wait_for(lambda got: "WAITING" in pushed(got).get(original.id, []))
        hook.wait_for(lambda got: missed <= {headers["X-Tether-Delivery"] for headers, _ in got})
