"""The A2A request handler over tether's own store: every A2A task *is* a tether task
(same id), read through ``Commands.view`` and changed only by engine commands; streams
follow the event feed; push notifications go out through the outbox (retried, never
dropped). Its methods are coroutines the SDK awaits on the event loop's thread."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any
from urllib.parse import urlsplit

import httpx
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import (
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a.utils.push_url_validator import validate_push_notification_url
from google.protobuf.json_format import MessageToDict

from tether.a2a.convert import (
    a2a_task,
    agent_card,
    as_a2a_errors,
    caller_of,
    changes,
    last_event_id,
    provider_of,
    push_config,
    text_of,
    trim_history,
)
from tether.config import section
from tether.domain.records import Task
from tether.engine.commands import A2A_PARENT
from tether.engine.unit import View
from tether.environment import Environment
from tether.errors import NotFound
from tether.ids import new_id
from tether.store.base import OutboxRow
from tether.types import Caller

#: How long a blocking SendMessage waits for its task to end (like ``mode: "wait"``, G8).
WAIT_SECONDS = 60.0
#: How long one webhook delivery may take before it counts as failed (and is retried).
PUSH_TIMEOUT = 10.0
#: A quiet stream looks again this often (whether its token was revoked, say).
RECHECK_SECONDS = 15.0
#: ListTasks page size: the default, and the most one page may hold.
PAGE_SIZE, MAX_PAGE_SIZE = 50, 100


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
        with as_a2a_errors(), self.env.commands.view() as u:
            return a2a_task(u, self._find(u, who, task_id))

    def _find(self, u: View, who: Caller, task_id: str) -> Task:
        """An A2A task the caller may see (the fence of G10), else TaskNotFound."""
        task = self.env.commands.task_for(u, who, task_id)
        if task.parent_environment_id != A2A_PARENT:
            raise NotFound(f"no A2A task with id {task_id!r}")
        return task

    async def on_message_send(self, params: pb.SendMessageRequest, context: ServerCallContext) -> pb.Task:
        who = caller_of(context)
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
        text, provider = text_of(message), provider_of(params)
        context_id = message.context_id
        if message.task_id:
            with as_a2a_errors(), self.env.commands.view() as u:
                task = self._find(u, who, message.task_id)
            if not task.is_open:
                raise UnsupportedOperationError(
                    f"task {task.id} is {task.status} and takes no more messages; send to its "
                    f"context {task.parent_thread_id} instead (a follow-up task answers)"
                )
            if context_id and context_id != task.parent_thread_id:
                raise InvalidParamsError(f"task {task.id} belongs to context {task.parent_thread_id}")
            context_id = task.parent_thread_id
        with as_a2a_errors():
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
        found = self._read(caller_of(context), params.id)
        if params.HasField("history_length"):
            trim_history(found, params.history_length)
        return found

    async def on_list_tasks(
        self, params: pb.ListTasksRequest, context: ServerCallContext
    ) -> pb.ListTasksResponse:
        """The caller's A2A tasks (follow-ups included), oldest first, in pages."""
        who = caller_of(context)
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
                trim_history(task, params.history_length)
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
        who = caller_of(context)
        with as_a2a_errors(), self.env.commands.view() as u:
            task = self._find(u, who, params.id)
        if not task.is_open:
            raise TaskNotCancelableError(f"task {task.id} is already {task.status}")
        with as_a2a_errors():
            await self.env.tools.task_cancel(who, task.id, "cancelled over A2A")
        return self._read(who, task.id)

    async def on_message_send_stream(
        self, params: pb.SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any]:
        who = caller_of(context)
        async for event in self._follow(who, await self._send_with_push(who, params)):
            yield event

    async def on_subscribe_to_task(
        self, params: pb.SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any]:
        """Also for a terminal task: its context may still get the follow-up (beyond A2A).
        With ``Last-Event-ID`` only the tasks that changed after that event are sent."""
        after = last_event_id(context)
        async for event in self._follow(caller_of(context), params.id, after):
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
            with as_a2a_errors(), self.env.commands.view() as u:
                tasks, live = self._from(u, who, task_id)
                found = [a2a_task(u, task) for task in tasks]
            if after is not None:
                changed = self._changed_since(after, who)
                sent = {task.id: task for task in found if changed is not None and task.id not in changed}
                after = None
            for task in found:
                for event in changes(sent.get(task.id), task):
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
        return await self._add_push(caller_of(context), params.task_id, params)

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
        with as_a2a_errors():
            self.env.commands.a2a_push_configs(who, task_id, put=MessageToDict(found))
        return found

    async def _webhook_allowed(self, url: str) -> bool:
        if self.allow_private_webhooks:
            return urlsplit(url).scheme in ("http", "https") and bool(urlsplit(url).hostname)
        return await validate_push_notification_url(url)

    def _push_configs(self, who: Caller, task_id: str) -> list[pb.TaskPushNotificationConfig]:
        with as_a2a_errors(), self.env.commands.view() as u:
            task = self._find(u, who, task_id)
            root = u.need(Task, task.follow_up_of or task.id, "task")
        return [push_config(config, task_id) for config in root.push]

    async def on_get_task_push_notification_config(
        self, params: pb.GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> pb.TaskPushNotificationConfig:
        for config in self._push_configs(caller_of(context), params.task_id):
            if config.id == params.id:
                return config
        raise TaskNotFoundError(f"no push notification config {params.id!r} for task {params.task_id}")

    async def on_list_task_push_notification_configs(
        self, params: pb.ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> pb.ListTaskPushNotificationConfigsResponse:
        configs = self._push_configs(caller_of(context), params.task_id)
        return pb.ListTaskPushNotificationConfigsResponse(configs=configs)

    async def on_delete_task_push_notification_config(
        self, params: pb.DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        with as_a2a_errors():
            self.env.commands.a2a_push_configs(caller_of(context), params.task_id, delete=params.id)

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
        config = push_config(stored, task.id)
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
        if caller_of(context).kind == "admin":
            for link in self.env.peers.list():
                kind = "an A2A agent" if link["kind"] == "a2a" else "a tether environment"
                card.skills.add(
                    id=f"link:{link['name']}",
                    name=f"delegate to {link['name']}",
                    description=f"a task here may delegate to {link['name']} ({kind}, linked from here)",
                    tags=["tether", "link", link["kind"]],
                )
        return card
