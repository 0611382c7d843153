"""Serving A2A (SPEC §14) over tether's own store.

The ``a2a-sdk`` carries the wire: its JSON-RPC and HTTP+JSON dispatchers parse requests,
answer with A2A error codes and serialise answers. What they call is :class:`TetherHandler`,
a ``RequestHandler`` with no task store or queue of its own: every A2A task *is* a tether
task (same id), read from the store through ``Commands.view`` and changed only by engine
commands. So GetTask and ListTasks answer the same after a restart, and the late answer —
the child's later reply after its task completed — is the follow-up tether already keeps,
shown as a new A2A task in the same context that references the original.

Everything here runs on the event loop's thread (the store's one owner): the handler's
methods are coroutines the SDK awaits directly.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import DefaultServerCallContextBuilder, create_jsonrpc_routes, create_rest_routes
from a2a.types import a2a_pb2 as pb
from a2a.utils.constants import (
    AGENT_CARD_WELL_KNOWN_PATH,
    PROTOCOL_VERSION_0_3,
    PROTOCOL_VERSION_1_0,
    TransportProtocol,
)
from a2a.utils.errors import (
    InvalidParamsError,
    InvalidRequestError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a.utils.push_url_validator import validate_push_notification_url
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.timestamp_pb2 import Timestamp
from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from tether import __version__
from tether.api.auth import bearer
from tether.config import section
from tether.domain.records import Run, Task
from tether.engine.commands import A2A_PARENT
from tether.engine.unit import View
from tether.environment import Environment
from tether.errors import Conflict, Forbidden, Invalid, NotFound, TetherError
from tether.ids import new_id
from tether.store.base import OutboxRow
from tether.types import Caller

JSONRPC_PATH = "/a2a"
REST_PREFIX = "/a2a/v1"
#: How long a blocking SendMessage waits for its task to end (like ``mode: "wait"``, G8).
WAIT_SECONDS = 60.0
#: How long one webhook delivery may take before it counts as failed (and is retried).
PUSH_TIMEOUT = 10.0
#: A quiet stream looks again this often (whether its token was revoked, say).
RECHECK_SECONDS = 15.0
#: ListTasks page size: the default, and the most one page may hold.
PAGE_SIZE, MAX_PAGE_SIZE = 50, 100

_STATES = {
    "queued": pb.TaskState.TASK_STATE_SUBMITTED,
    "running": pb.TaskState.TASK_STATE_WORKING,
    "completed": pb.TaskState.TASK_STATE_COMPLETED,
    "failed": pb.TaskState.TASK_STATE_FAILED,
    "interrupted": pb.TaskState.TASK_STATE_FAILED,
    "cancelled": pb.TaskState.TASK_STATE_CANCELED,
}


# ---------------------------------------------------------------------------- tether → A2A


def a2a_task(u: View, task: Task) -> pb.Task:
    """One tether task as an A2A task: state, the status message (interim, result or error),
    the result as an artifact, and for a follow-up the reference to the task it follows."""
    found = pb.Task(id=task.id, context_id=task.parent_thread_id)
    found.status.state = _STATES[task.status]
    found.status.timestamp.CopyFrom(_timestamp(task.completed_at or task.created_at))
    text = _status_text(u, task)
    if text is not None:
        message = found.status.message
        message.message_id, message.role = f"{task.id}-status", pb.Role.ROLE_AGENT
        message.task_id, message.context_id = task.id, task.parent_thread_id
        message.parts.add(text=text)
        if task.follow_up_of:
            message.reference_task_ids.append(task.follow_up_of)
        found.history.append(message)
    result = (task.result or {}).get("text")
    if task.status == "completed" and result is not None:
        found.artifacts.add(artifact_id=f"{task.id}-result", name="result").parts.add(text=result)
    found.metadata.update(
        {"tether.status": task.status, "tether.childThreadId": task.child_thread_id}
        | ({"tether.followUpOf": task.follow_up_of} if task.follow_up_of else {})
    )
    return found


def _status_text(u: View, task: Task) -> str | None:
    if task.is_open:
        return task.interim
    result = task.result or {}
    if task.status in ("failed", "interrupted"):
        run = u.load(Run, result.get("runId"))
        return (run.error if run else None) or result.get("text") or f"the task {task.status}"
    if task.status == "cancelled":
        return "cancelled"
    return result.get("text")


def _timestamp(at: str) -> Timestamp:
    stamp = Timestamp()
    stamp.FromJsonString(at)
    return stamp


# ---------------------------------------------------------------------------- A2A → tether


def _text(message: pb.Message) -> str:
    """The message's text parts, joined; a message without text is refused."""
    texts = [part.text for part in message.parts if part.WhichOneof("content") == "text"]
    text = "\n\n".join(t for t in texts if t.strip())
    if not text:
        raise InvalidParamsError("the message needs a non-empty text part (tether runs text tasks)")
    return text


def _provider(params: pb.SendMessageRequest) -> str | None:
    """``tether.provider`` from the message's metadata (or the request's), if given."""
    for metadata in (params.message.metadata, params.metadata):
        value = metadata.fields.get("tether.provider")
        if value is not None:
            if value.WhichOneof("kind") != "string_value":
                raise InvalidParamsError("metadata 'tether.provider' must be a string")
            return value.string_value
    return None


@contextlib.contextmanager
def _as_a2a_errors() -> Iterator[None]:
    """tether's errors as A2A's: unknown → task not found, bad input → invalid params."""
    try:
        yield
    except NotFound as error:
        raise TaskNotFoundError(error.message) from error
    except Invalid as error:
        raise InvalidParamsError(error.message) from error
    except (Conflict, Forbidden) as error:
        raise UnsupportedOperationError(error.message) from error
    except TetherError as error:
        raise InvalidRequestError(error.message) from error


def _caller(context: ServerCallContext) -> Caller:
    return context.state["tether.caller"]


# ---------------------------------------------------------------------------- the handler


class TetherHandler(RequestHandler):
    """The A2A methods, each one engine command or one read of the store."""

    def __init__(self, env: Environment) -> None:
        self.env = env
        config = section(env.config, "a2a")
        self.wait_seconds = float(config.get("wait_seconds", WAIT_SECONDS))
        #: Webhooks on loopback and private ranges (SSRF): refused unless allowed here.
        self.allow_private_webhooks = bool(config.get("allow_private_webhooks", False))

    def _read(self, who: Caller, task_id: str) -> pb.Task:
        with _as_a2a_errors(), self.env.commands.view() as u:
            return a2a_task(u, self._find(u, who, task_id))

    def _find(self, u: View, who: Caller, task_id: str) -> Task:
        """An A2A task the caller may see (the fence of G10), else TaskNotFound."""
        task = self.env.commands.task_for(u, who, task_id)
        if task.parent_environment_id != A2A_PARENT:
            raise NotFound(f"no A2A task with id {task_id!r}")
        return task

    async def on_message_send(self, params: pb.SendMessageRequest, context: ServerCallContext) -> pb.Task:
        who = _caller(context)
        task_id = await self._send_with_push(who, params)
        if not params.configuration.return_immediately:
            await self._until_ended(task_id)
        return self._read(who, task_id)

    async def _send_with_push(self, who: Caller, params: pb.SendMessageRequest) -> str:
        """``_send``, then the webhook the request names (checked first: a refused one
        changes nothing)."""
        webhook = params.configuration.task_push_notification_config
        wanted = params.configuration.HasField("task_push_notification_config")
        if wanted and not await self._webhook_allowed(webhook.url):
            raise InvalidParamsError(f"push notification url {webhook.url!r} is not a public http(s) address")
        task_id = self._send(who, params)
        if wanted:
            await self._add_push(who, task_id, webhook)
        return task_id

    def _send(self, who: Caller, params: pb.SendMessageRequest) -> str:
        """A new context starts a task; a message to a live task (or to a context) goes to
        its thread as from the parent. Answers the id of the task the message is for."""
        message = params.message
        text, provider = _text(message), _provider(params)
        context_id = message.context_id
        if message.task_id:
            with _as_a2a_errors(), self.env.commands.view() as u:
                task = self._find(u, who, message.task_id)
            if not task.is_open:
                raise UnsupportedOperationError(
                    f"task {task.id} is {task.status} and takes no more messages; send to its "
                    f"context {task.parent_thread_id} instead (a follow-up task answers)"
                )
            if context_id and context_id != task.parent_thread_id:
                raise InvalidParamsError(f"task {task.id} belongs to context {task.parent_thread_id}")
            context_id = task.parent_thread_id
        with _as_a2a_errors():
            view = self.env.commands.a2a_message(
                who, context_id or new_id("ctx"), text, message.message_id, provider
            )
        return view["taskId"]

    async def _until_ended(self, task_id: str) -> None:
        """Wait (bounded) until the task is terminal; a timeout answers the task as it stands."""

        def ended() -> bool | None:
            with self.env.commands.view() as u:
                task = u.load(Task, task_id)
            return True if task is None or not task.is_open else None

        await self.env.runtime.notifier.wait_until([f"task:{task_id}"], ended, self.wait_seconds)

    async def on_get_task(self, params: pb.GetTaskRequest, context: ServerCallContext) -> pb.Task:
        found = self._read(_caller(context), params.id)
        if params.HasField("history_length"):
            _trim_history(found, params.history_length)
        return found

    async def on_list_tasks(
        self, params: pb.ListTasksRequest, context: ServerCallContext
    ) -> pb.ListTasksResponse:
        """The caller's A2A tasks (follow-ups included), oldest first, in pages."""
        who = _caller(context)
        size = params.page_size or PAGE_SIZE
        if not 1 <= size <= MAX_PAGE_SIZE:
            raise InvalidParamsError(f"pageSize must be between 1 and {MAX_PAGE_SIZE}")
        if params.page_token and not params.page_token.isdigit():
            raise InvalidParamsError(f"pageToken {params.page_token!r} is not one this server gave")
        start = int(params.page_token or 0)
        where: dict[str, Any] = {"parent_environment_id": A2A_PARENT}
        if params.context_id:
            where["parent_thread_id"] = params.context_id
        with self.env.commands.view() as u:
            found = [a2a_task(u, task) for task in u.query(Task, **where) if self._visible(u, who, task)]
        if params.status:
            found = [task for task in found if task.status.state == params.status]
        page = found[start : start + size]
        for task in page:
            if params.HasField("history_length"):
                _trim_history(task, params.history_length)
            if params.HasField("include_artifacts") and not params.include_artifacts:
                del task.artifacts[:]
        more = start + size < len(found)
        return pb.ListTasksResponse(
            tasks=page,
            next_page_token=str(start + size) if more else "",
            page_size=size,
            total_size=len(found),
        )

    def _visible(self, u: View, who: Caller, task: Task) -> bool:
        try:
            self.env.commands.task_for(u, who, task.id)
        except NotFound:
            return False
        return True

    async def on_cancel_task(self, params: pb.CancelTaskRequest, context: ServerCallContext) -> pb.Task:
        """``task_cancel``: the child's run, commands and monitors stop; the task is CANCELED."""
        who = _caller(context)
        with _as_a2a_errors(), self.env.commands.view() as u:
            task = self._find(u, who, params.id)
        if not task.is_open:
            raise TaskNotCancelableError(f"task {task.id} is already {task.status}")
        with _as_a2a_errors():
            await self.env.tools.task_cancel(who, task.id, "cancelled over A2A")
        return self._read(who, task.id)

    async def on_message_send_stream(
        self, params: pb.SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any]:
        who = _caller(context)
        async for event in self._follow(who, await self._send_with_push(who, params)):
            yield event

    async def on_subscribe_to_task(
        self, params: pb.SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any]:
        """Also for a terminal task: its context may still get the follow-up (beyond A2A).
        With ``Last-Event-ID`` only the tasks that changed after that event are sent."""
        after = _last_event_id(context)
        async for event in self._follow(_caller(context), params.id, after):
            yield event

    async def _follow(self, who: Caller, task_id: str, after: int | None = None) -> AsyncGenerator[Any]:
        """The task, then every change of it and of the tasks that follow it in its context —
        a late answer's follow-up task included — until none is open and the child has no
        work left that could still answer. Each step re-reads the store, so a subscriber
        that comes back gets every task it missed, whole; each event carries the store's
        event id it is current to (``tether.eventId``, the SSE id), to resume from."""
        sent: dict[str, pb.Task] = {}
        newer = self.env.store.last_event_seq
        while True:
            seen = newer()  # before the read: any change after it wakes the wait below
            with _as_a2a_errors(), self.env.commands.view() as u:
                tasks, live = self._from(u, who, task_id)
                found = [a2a_task(u, task) for task in tasks]
            if after is not None:
                changed = self._changed_since(after, who)
                sent = {task.id: task for task in found if changed is not None and task.id not in changed}
                after = None
            for task in found:
                for event in _changes(sent.get(task.id), task):
                    event.metadata.update({"tether.eventId": str(seen)})
                    yield event
                sent[task.id] = task
            if not live or (who.kind == "link" and not self.env.tokens.active(who.token_id or "")):
                return  # done; or the token was revoked: the stream ends, a reconnect gets 401
            child = f"thread:{tasks[0].child_thread_id}"
            await self.env.runtime.notifier.wait_until(
                [child], lambda seen=seen: True if newer() > seen else None, RECHECK_SECONDS
            )

    def _changed_since(self, after: int, who: Caller) -> set[str | None] | None:
        """Ids of the tasks with an event after ``after`` — None (all of them) when events
        the client missed may already be pruned (the feed's retention, G7)."""
        token = who.token_id if who.kind == "link" else None
        oldest = self.env.store.events_after(0, 1)
        if oldest and after < oldest[0].seq - 1:
            return None
        changed: set[str | None] = set()
        while batch := self.env.store.events_after(after, 500, token):
            changed |= {event.task_id for event in batch}
            after = batch[-1].seq
        return changed

    def _from(self, u: View, who: Caller, task_id: str) -> tuple[list[Task], bool]:
        """The task and the later tasks of its context; whether any may still change."""
        first = self._find(u, who, task_id)
        context = u.query(Task, parent_thread_id=first.parent_thread_id, parent_environment_id=A2A_PARENT)
        tasks = context[[task.id for task in context].index(first.id) :]
        live = any(task.is_open for task in tasks) or context[-1].child_active
        return tasks, live

    async def on_create_task_push_notification_config(
        self, params: pb.TaskPushNotificationConfig, context: ServerCallContext
    ) -> pb.TaskPushNotificationConfig:
        return await self._add_push(_caller(context), params.task_id, params)

    async def _add_push(
        self, who: Caller, task_id: str, config: pb.TaskPushNotificationConfig
    ) -> pb.TaskPushNotificationConfig:
        """Keep a webhook for the task's context, once its URL passed the SSRF check."""
        if not config.url:
            raise InvalidParamsError("a push notification config needs a url")
        if not await self._webhook_allowed(config.url):
            raise InvalidParamsError(
                f"push notification url {config.url!r} is not a public http(s) address; "
                "loopback and private ranges need [a2a] allow_private_webhooks = true"
            )
        found = pb.TaskPushNotificationConfig()
        found.CopyFrom(config)
        found.task_id, found.id = task_id, config.id or new_id("push")
        with _as_a2a_errors():
            self.env.commands.a2a_push_configs(who, task_id, put=MessageToDict(found))
        return found

    async def _webhook_allowed(self, url: str) -> bool:
        if self.allow_private_webhooks:
            return urlsplit(url).scheme in ("http", "https") and bool(urlsplit(url).hostname)
        return await validate_push_notification_url(url)

    def _push_configs(self, who: Caller, task_id: str) -> list[pb.TaskPushNotificationConfig]:
        with _as_a2a_errors(), self.env.commands.view() as u:
            task = self._find(u, who, task_id)
            root = u.need(Task, task.follow_up_of or task.id, "task")
        return [_config(config, task_id) for config in root.push]

    async def on_get_task_push_notification_config(
        self, params: pb.GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> pb.TaskPushNotificationConfig:
        for config in self._push_configs(_caller(context), params.task_id):
            if config.id == params.id:
                return config
        raise TaskNotFoundError(f"no push notification config {params.id!r} for task {params.task_id}")

    async def on_list_task_push_notification_configs(
        self, params: pb.ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> pb.ListTaskPushNotificationConfigsResponse:
        configs = self._push_configs(_caller(context), params.task_id)
        return pb.ListTaskPushNotificationConfigsResponse(configs=configs)

    async def on_delete_task_push_notification_config(
        self, params: pb.DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        with _as_a2a_errors():
            self.env.commands.a2a_push_configs(_caller(context), params.task_id, delete=params.id)

    async def push(self, row: OutboxRow) -> None:
        """The ``a2a.push`` side effect: POST the task as it stands now to one webhook, as
        the SDK's sender would (a StreamResponse, ``X-A2A-Notification-Token``). A failure
        raises: the outbox tries again with backoff and parks it visibly, never drops it."""
        with self.env.commands.view() as u:
            task = u.load(Task, row.payload["taskId"])
            root = task and u.load(Task, task.follow_up_of or task.id)
            stored = next(
                (c for c in (root.push if root else []) if c["id"] == row.payload["configId"]), None
            )
            if task is None or stored is None:
                return  # the config was deleted meanwhile: nothing to deliver
            body = MessageToDict(pb.StreamResponse(task=a2a_task(u, task)))
        config = _config(stored, task.id)
        if not await self._webhook_allowed(config.url):
            raise PermissionError(f"push url {config.url} no longer resolves to a public address")
        # The same id on every attempt of one delivery: a receiver can drop a repeat.
        headers = {"X-Tether-Delivery": f"{self.env.environment_id}:{row.id}"}
        if config.token:
            headers["X-A2A-Notification-Token"] = config.token
        if config.authentication.scheme and config.authentication.credentials:
            headers["Authorization"] = f"{config.authentication.scheme} {config.authentication.credentials}"
        async with httpx.AsyncClient(timeout=PUSH_TIMEOUT) as http:
            answer = await http.post(config.url, json=body, headers=headers)
        answer.raise_for_status()

    async def on_get_extended_agent_card(
        self, params: pb.GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> pb.AgentCard:
        """The card for a caller who signed in: the public card, plus — for the admin, whose
        tasks may use this environment's links — one skill per link (a tether environment or
        an A2A agent) that a task here can delegate to."""
        card = agent_card(self.env, context.state["tether.base_url"])
        if _caller(context).kind == "admin":
            for link in self.env.peers.list():
                kind = "an A2A agent" if link["kind"] == "a2a" else "a tether environment"
                card.skills.add(
                    id=f"link:{link['name']}",
                    name=f"delegate to {link['name']}",
                    description=f"a task here may delegate to {link['name']} ({kind}, linked from here)",
                    tags=["tether", "link", link["kind"]],
                )
        return card


def _changes(before: pb.Task | None, now: pb.Task) -> list[Any]:
    """Stream events from one task's last sent state to its current one: a new task whole,
    then a new result as an artifact update and a new status as a status update."""
    if before is None:
        return [now]
    events: list[Any] = []
    if now.artifacts != before.artifacts:
        events += [
            pb.TaskArtifactUpdateEvent(task_id=now.id, context_id=now.context_id, artifact=a, last_chunk=True)
            for a in now.artifacts
        ]
    if now.status.state != before.status.state or now.status.message != before.status.message:
        events.append(pb.TaskStatusUpdateEvent(task_id=now.id, context_id=now.context_id, status=now.status))
    return events


def _config(stored: dict[str, Any], task_id: str) -> pb.TaskPushNotificationConfig:
    found = ParseDict(stored, pb.TaskPushNotificationConfig(), ignore_unknown_fields=True)
    found.task_id = task_id
    return found


def _last_event_id(context: ServerCallContext) -> int | None:
    """The ``Last-Event-ID`` a reconnecting stream client sent, if any."""
    raw = context.state.get("headers", {}).get("last-event-id")
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or len(raw) > 18:
        raise InvalidParamsError(f"Last-Event-ID must be an event id this server sent, not {raw!r}")
    return int(raw)


def _trim_history(task: pb.Task, length: int) -> None:
    if length < 0:
        raise InvalidParamsError("historyLength must not be negative")
    del task.history[: max(len(task.history) - length, 0)]


# ---------------------------------------------------------------------------- the card, routes


def agent_card(env: Environment, base_url: str) -> pb.AgentCard:
    """The environment as an A2A agent: its providers as skills, both bindings, Bearer auth."""
    card = pb.AgentCard(
        name=env.name,
        description=(
            f"tether environment {env.name} ({env.environment_id}): agent threads that run tasks "
            "and always deliver the answer — a late answer arrives as a follow-up task in the "
            "same context, referencing the original."
        ),
        version=__version__,
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
    )
    card.provider.organization, card.provider.url = "tether", base_url
    card.capabilities.streaming = True
    card.capabilities.push_notifications = True
    card.capabilities.extended_agent_card = True
    bindings = ((TransportProtocol.JSONRPC, JSONRPC_PATH), (TransportProtocol.HTTP_JSON, REST_PREFIX))
    for version in (PROTOCOL_VERSION_1_0, PROTOCOL_VERSION_0_3):  # 0.3 clients read the card too
        for binding, path in bindings:
            card.supported_interfaces.add(
                url=f"{base_url}{path}", protocol_binding=binding.value, protocol_version=version
            )
    for name in env.runtime.providers:
        card.skills.add(
            id=name,
            name=f"{name} agent",
            description=f"a tether thread on the {name} provider (message metadata tether.provider={name!r})",
            tags=["tether", name],
        )
    scheme = card.security_schemes["bearer"].http_auth_security_scheme
    scheme.scheme, scheme.description = "Bearer", "tether's admin token or a link token (tether token create)"
    card.security_requirements.add().schemes["bearer"].SetInParent()
    return card


class _ContextBuilder(DefaultServerCallContextBuilder):
    """Hands the authenticated caller to the handler (set by :func:`_guarded`)."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state["tether.caller"] = request.scope["tether.caller"]
        context.state["tether.base_url"] = str(request.base_url).rstrip("/")
        return context


def _guarded(
    env: Environment, endpoint: Callable[[Request], Awaitable[Response]]
) -> Callable[[Request], Awaitable[Response]]:
    """Every A2A call needs the admin token or a link token (G10): no token, or a bad one,
    gets HTTP 401; a thread credential 403 (a task it started would be nobody's)."""

    async def guarded(request: Request) -> Response:
        try:
            who = env.tokens.authenticate(bearer(request))
            if who.kind not in ("admin", "link"):
                raise Forbidden("A2A takes the admin token or a link token, not a thread credential")
            request.scope["tether.caller"] = who
        except TetherError as error:
            return JSONResponse(
                {"error": error.to_dict()}, status_code=error.status, headers={"WWW-Authenticate": "Bearer"}
            )
        response = await endpoint(request)
        if isinstance(response, EventSourceResponse):
            response.body_iterator = _with_event_ids(response.body_iterator)
        return response

    return guarded


async def _with_event_ids(events: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """Give each SSE event the id its A2A event carries (``tether.eventId``), so a client
    can resume with ``Last-Event-ID`` (A2A itself has no ids on its streams)."""
    async for event in events:
        data = event.get("data") if isinstance(event, dict) else getattr(event, "data", None)
        event_id = _event_id(data)
        if event_id is not None and isinstance(event, dict):
            event = {**event, "id": event_id}
        elif event_id is not None:
            event.id = event_id
        yield event


def _event_id(data: Any) -> str | None:
    try:
        body = json.loads(data) if isinstance(data, str) else None
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    found = body.get("result", body)
    for kind in ("task", "statusUpdate", "artifactUpdate"):
        metadata = (found.get(kind) or {}).get("metadata") or {} if isinstance(found, dict) else {}
        if "tether.eventId" in metadata:
            return str(metadata["tether.eventId"])
    return None


def build_routes(env: Environment) -> list[BaseRoute]:
    handler = TetherHandler(env)
    env.runtime.add_handler("a2a.push", handler.push)
    builder = _ContextBuilder()
    sdk_routes = [
        *create_jsonrpc_routes(handler, JSONRPC_PATH, context_builder=builder, enable_v0_3_compat=True),
        *create_rest_routes(
            handler, context_builder=builder, enable_v0_3_compat=True, path_prefix=REST_PREFIX
        ),
    ]

    async def card(request: Request) -> Response:
        return JSONResponse(agent_card_to_dict(agent_card(env, str(request.base_url).rstrip("/"))))

    found: list[BaseRoute] = [Route(AGENT_CARD_WELL_KNOWN_PATH, card, methods=["GET"])]
    for route in sdk_routes:
        if isinstance(route, Mount):
            continue  # the SDK's per-tenant copies (/{tenant}/…): tether has no tenants
        assert isinstance(route, Route)
        methods = sorted((route.methods or set()) - {"HEAD"})
        found.append(Route(route.path, _guarded(env, route.endpoint), methods=methods))
    return found
