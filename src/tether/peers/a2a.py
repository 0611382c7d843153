"""Links to A2A agents (SPEC §14, consuming): any A2A agent can be the child of a thread.

An A2A link is a :class:`~tether.peers.peer.Peer` whose far side speaks A2A, through the
official ``a2a-sdk`` client, instead of tether's API. The parts a tether link has stay:

- **creating and cancelling** are the link's durable pushes: ``delegate_remote`` records
  the task with its ``remote_pending`` mark (and a ``peer.push`` outbox row that kicks the
  pusher), and the pusher sends ``SendMessage`` (``returnImmediately``; the message id is
  our task id, so an agent that keys on it creates one task) or ``CancelTask``, retried at
  most 1 s apart until the agent answers — also after a restart or a partition (G6, G7).
  The remote ids it answers (its task id, its context id as the child thread) are stored
  by a command.
- **following** replaces the event feed: for every context we delegated into, the agent's
  stream (``SubscribeToTask``) rings first, and each ring reads the whole context;
  ``ListTasks`` (or, where the agent serves none, ``GetTask``) polling is the fallback and
  the safety net. Every read goes through :meth:`Commands.apply_a2a`, which maps the
  agent's task onto ours and turns a new task of the context that references ours into a
  follow-up with its own completion wake — found again by its remote id on every later
  read, so it is opened once. A context is watched while a task in it is open and for a
  window after (``[a2a] follow_up_days``, default 7), since the late answer comes later.

Interactive calls of a tether link (send, read, wait, interrupt, list) have no A2A
counterpart here and are refused with a clear error.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from datetime import UTC, timedelta
from typing import Any

import httpx
from a2a.client import A2ACardResolver, A2AClientError, Client, ClientConfig, ClientFactory
from a2a.types import a2a_pb2 as pb
from a2a.utils.constants import TransportProtocol
from a2a.utils.errors import A2AError, MethodNotFoundError, UnsupportedOperationError

from tether.config import section
from tether.domain.records import Link, Task
from tether.errors import Invalid, Unavailable
from tether.ids import format_time, now, parse_time
from tether.peers.peer import Origin, Peer
from tether.types import Caller

log = logging.getLogger(__name__)

#: How often a context without a live stream is read (G7: at most 1 s apart).
POLL = 0.5
#: How often a context whose tasks all ended is read for a late follow-up task.
FOLLOW_UP_POLL = 1.0
#: A context with a live stream is still read this often: a safety net for a stream
#: that went quiet on a dead connection.
STREAM_RECHECK = 2.0
#: How long a stream may stay silent before it is dropped and opened again.
STREAM_READ_TIMEOUT = 20.0
BINDINGS = [TransportProtocol.JSONRPC.value, TransportProtocol.HTTP_JSON.value]

_STATES = {
    pb.TaskState.TASK_STATE_SUBMITTED: "queued",
    pb.TaskState.TASK_STATE_WORKING: "running",
    pb.TaskState.TASK_STATE_INPUT_REQUIRED: "running",
    pb.TaskState.TASK_STATE_AUTH_REQUIRED: "running",
    pb.TaskState.TASK_STATE_COMPLETED: "completed",
    pb.TaskState.TASK_STATE_FAILED: "failed",
    pb.TaskState.TASK_STATE_REJECTED: "failed",
    pb.TaskState.TASK_STATE_CANCELED: "cancelled",
}


def link_id(url: str) -> str:
    """An A2A agent has no environment id: its link is named by its URL, so linking the
    same URL again updates the link instead of adding a second one."""
    return "a2a_" + hashlib.sha256(url.encode()).hexdigest()[:16]


async def identity(url: str, token: str | None, label: str | None) -> tuple[str, str]:
    """``(link id, name)`` of the A2A agent at ``url``: its card must answer (the name is
    the card's unless ``label`` gives one)."""
    card = await _card(_http(token, 5.0), url, close=True)
    return link_id(url), label or card.name or url


def _http(token: str | None, read: float) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(read, connect=1.0))


async def _card(http: httpx.AsyncClient, url: str, close: bool = False) -> pb.AgentCard:
    try:
        return await A2ACardResolver(http, url).get_agent_card()
    except (A2AError, httpx.HTTPError, ValueError) as error:
        raise Invalid(f"{url} does not answer as an A2A agent (no agent card): {error}") from None
    finally:
        if close:
            await http.aclose()


def _texts(parts: Any) -> str | None:
    texts = [part.text for part in parts if part.WhichOneof("content") == "text"]
    return "\n\n".join(texts) if texts else None


def task_view(remote: pb.Task) -> dict[str, Any]:
    """The agent's task as a tether task view (the fields ``tasks.mirror`` takes): its state,
    the status message as the interim reply while open, and once ended the artifacts' text
    (else the status message) as the result."""
    status = _STATES.get(remote.status.state, "running")
    message = _texts(remote.status.message.parts)
    view: dict[str, Any] = {"childThreadId": remote.context_id, "status": status}
    if status in ("queued", "running"):
        view.update(workState="working", interim=message)
        return view
    artifacts = _texts(part for artifact in remote.artifacts for part in artifact.parts)
    result: dict[str, Any] = {"text": artifacts if artifacts is not None else message, "runId": None}
    if status == "failed":
        result["error"] = message or f"the A2A agent reported {pb.TaskState.Name(remote.status.state)}"
    stamp = remote.status.timestamp
    ended = format_time(stamp.ToDatetime(tzinfo=UTC)) if stamp.seconds else now()
    view.update(workState="result_available", result={**result, "status": status}, completedAt=ended)
    return view


def references(remote: pb.Task) -> list[str]:
    """The task ids this task's messages reference (a late answer names the original)."""
    found = list(remote.status.message.reference_task_ids)
    for message in remote.history:
        found += [r for r in message.reference_task_ids if r not in found]
    return found


def _ordered(found: list[pb.Task]) -> list[pb.Task]:
    """Tasks referencing none first, then by time: an original before its follow-ups."""
    return sorted(found, key=lambda t: (bool(references(t)), t.status.timestamp.ToNanoseconds()))


class A2APeer(Peer):
    """One link to an A2A agent: the pusher sends and cancels, the follower reads back."""

    def __init__(self, origin: Origin, link: Link) -> None:
        super().__init__(origin, link)
        self._batching = False  # one SendMessage per task
        self._clients: tuple[Client, Client] | None = None
        self._stream_http = _http(link.token or None, STREAM_READ_TIMEOUT)
        #: context id → when it was read last (loop clock); the contexts being followed.
        self._watched: dict[str, float] = {}
        self._streams: dict[str, asyncio.Task[None]] = {}
        self._no_stream: set[str] = set()  # remote tasks the agent will not stream
        self._no_list = False  # the agent serves no ListTasks: GetTask it is
        self._applied: dict[str, dict[str, Any]] = {}
        self._wake = asyncio.Event()
        days = float(section(origin.config, "a2a").get("follow_up_days", 7))
        self.window = timedelta(days=days)

    async def close(self) -> None:
        for stream in self._streams.values():
            stream.cancel()
        await super().close()
        await self._stream_http.aclose()

    def view(self) -> dict[str, Any]:
        return {**super().view(), "kind": "a2a"}

    async def _client(self, streaming: bool = False) -> Client:
        """The SDK's clients (one for calls, one for streams), made from the agent's card,
        fetched once per start of the link."""
        if self._clients is None:
            card = await _card(self.http, self.link.url)
            self._clients = tuple(  # type: ignore[assignment]
                ClientFactory(
                    ClientConfig(streaming=stream, httpx_client=http, supported_protocol_bindings=BINDINGS)
                ).create(card)
                for stream, http in ((False, self.http), (True, self._stream_http))
            )
        assert self._clients is not None
        return self._clients[1 if streaming else 0]

    # ------------------------------------------------------------------ the pusher's calls

    async def _create(self, task: Task) -> None:
        request = task.remote_request or {}
        message = pb.Message(message_id=task.id, role=pb.Role.ROLE_USER)
        message.parts.add(text=request.get("task", ""))
        if request.get("provider"):
            message.metadata.update({"tether.provider": request["provider"]})
        send = pb.SendMessageRequest(message=message)
        send.configuration.return_immediately = True
        try:
            client = await self._client()
            answers = [answer async for answer in client.send_message(send)]
        except (A2AClientError, Invalid) as error:
            raise self._unreachable(error) from None
        except A2AError as error:
            self.commands.remote_refused(task.id, f"A2A agent {self.link.name} refused the task: {error}")
            return
        self._status("ok", None)
        answer = answers[-1] if answers else pb.StreamResponse()
        if answer.HasField("task"):
            self.commands.remote_sent(task.id, answer.task.context_id, answer.task.id)
            self._watched[answer.task.context_id] = 0.0
            self._apply(answer.task)
        else:  # the agent answered with a message: that is the whole answer
            reply = answer.message
            remote_id = f"message:{reply.message_id or task.id}"
            self.commands.remote_sent(task.id, reply.context_id or task.id, remote_id)
            done = pb.Task(id=remote_id, context_id=reply.context_id or task.id)
            done.status.state = pb.TaskState.TASK_STATE_COMPLETED
            done.status.message.CopyFrom(reply)
            self._apply(done)
        self._wake.set()

    async def _cancel(self, task: Task) -> None:
        if task.remote_task_id and not task.remote_task_id.startswith("message:"):
            try:
                client = await self._client()
                await client.cancel_task(pb.CancelTaskRequest(id=task.remote_task_id))
            except (A2AClientError, Invalid) as error:
                raise self._unreachable(error) from None
            except A2AError as error:  # it ended on its own, or cannot be cancelled: nothing to ask
                log.info("A2A agent %s did not cancel %s: %s", self.link.name, task.remote_task_id, error)
        self.commands.remote_sent(task.id, call="cancel")

    def _unreachable(self, error: Exception) -> Unavailable:
        """A call the pusher retries: the link shows why meanwhile (a refused token too)."""
        self._status("unreachable", str(error) or type(error).__name__)
        return Unavailable(f"A2A agent {self.link.name} not reached: {error}", "unreachable")

    # ------------------------------------------------------------------ following

    async def _follow(self) -> None:
        """Supervised: a failed round marks the link and is tried again ≤ POLL later."""
        self._seed()
        while True:
            try:
                if await self._round():
                    self._status("ok", None)
            except (A2AClientError, Invalid, httpx.HTTPError) as error:
                self._status("unreachable", str(error) or type(error).__name__)
            except A2AError as error:
                self._status("error", str(error))
            except Exception as error:  # never let the follower die
                log.exception("following A2A agent %s failed", self.link.name)
                self._status("error", str(error))
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL)

    def _seed(self) -> None:
        """After a start: the contexts of this link's tasks still worth following."""
        with self.commands.view() as u:
            mine = [
                t
                for t in u.query(Task, parent_environment_id=self.origin.environment_id)
                if t.child_environment_id == self.environment_id and t.remote_task_id
            ]
        for task in mine:
            if self._worth_following([task]):
                self._watched[task.child_thread_id] = 0.0

    def _worth_following(self, tasks: list[Task]) -> bool:
        """Open, or ended within the window (a late answer may still come) and not cancelled."""
        if any(t.is_open for t in tasks):
            return True
        if any(t.status == "cancelled" for t in tasks):
            return False
        ended = max((t.completed_at or t.created_at for t in tasks), default=None)
        return ended is not None and parse_time(now()) - parse_time(ended) < self.window

    def _context(self, context_id: str) -> list[Task]:
        with self.commands.view() as u:
            return [
                t
                for t in u.query(Task, child_thread_id=context_id)
                if t.child_environment_id == self.environment_id and t.remote_task_id
            ]

    async def _round(self) -> int:
        """Read the contexts due for a read; how many were read."""
        clock, read = asyncio.get_running_loop().time(), 0
        for context_id, read_at in list(self._watched.items()):
            tasks = self._context(context_id)
            if not self._worth_following(tasks):
                self._forget(context_id)
                continue
            open_ones = [t for t in tasks if t.is_open]
            streaming = context_id in self._streams
            every = STREAM_RECHECK if streaming else POLL if open_ones else FOLLOW_UP_POLL
            if clock - read_at >= every:
                await self._sync(context_id, tasks)
                read += 1
            if open_ones and not streaming:
                self._open_stream(context_id, open_ones[-1])
        return read

    def _forget(self, context_id: str) -> None:
        self._watched.pop(context_id, None)
        stream = self._streams.pop(context_id, None)
        if stream is not None:
            stream.cancel()

    async def _sync(self, context_id: str, tasks: list[Task]) -> None:
        """Read the context's tasks from the agent and apply each that changed."""
        self._watched[context_id] = asyncio.get_running_loop().time()
        client = await self._client()
        found: list[pb.Task] = []
        if not self._no_list:
            try:
                page = await client.list_tasks(
                    pb.ListTasksRequest(context_id=context_id, include_artifacts=True, page_size=100)
                )
                found = list(page.tasks)
            except (UnsupportedOperationError, MethodNotFoundError):
                self._no_list = True
        if self._no_list:
            remote_ids = [t.remote_task_id for t in tasks if t.is_open]
            found = [await client.get_task(pb.GetTaskRequest(id=r)) for r in remote_ids if r]
        for remote in _ordered(found):
            self._apply(remote)

    def _apply(self, remote: pb.Task) -> None:
        view = task_view(remote)
        seen = {key: value for key, value in view.items() if key != "completedAt"}
        if self._applied.get(remote.id) == seen:
            return  # nothing new since the last read: no transaction
        self.commands.apply_a2a(self.environment_id, remote.id, references(remote), view)
        self._applied[remote.id] = seen

    def _open_stream(self, context_id: str, task: Task) -> None:
        remote_id = task.remote_task_id or ""
        if remote_id in self._no_stream or remote_id.startswith("message:"):
            return
        stream = asyncio.create_task(self._stream(context_id, remote_id), name=f"a2a stream {remote_id}")
        self._streams[context_id] = stream
        stream.add_done_callback(lambda done: self._stream_ended(context_id, done))

    async def _stream(self, context_id: str, remote_id: str) -> None:
        """The agent's stream of the task; each event rings for a read of its context."""
        try:
            client = await self._client(streaming=True)
            async for _event in client.subscribe(pb.SubscribeToTaskRequest(id=remote_id)):
                await self._sync(context_id, self._context(context_id))
        except NotImplementedError:  # the agent streams nothing: polling it is
            self._no_stream.add(remote_id)
        except A2AError as error:
            if not isinstance(error, A2AClientError):  # refused for this task: poll it
                self._no_stream.add(remote_id)
            log.info("stream of %s at %s ended: %s", remote_id, self.link.name, error)

    def _stream_ended(self, context_id: str, done: asyncio.Task[None]) -> None:
        if self._streams.get(context_id) is done:
            del self._streams[context_id]
        if not done.cancelled() and done.exception() is not None:
            log.warning("stream of context %s failed: %r", context_id, done.exception())
        self._wake.set()

    # ------------------------------------------------------------------ refused calls

    def _refuse(self, what: str) -> Invalid:
        return Invalid(
            f"{self.link.name} is an A2A agent: it takes delegate_task and task_cancel, not {what}"
        )

    async def thread_send(self, caller: Caller, thread_id: str, message: str, *args: Any, **kw: Any) -> Any:
        raise self._refuse("thread_send")

    async def thread_read(self, caller: Caller, thread_id: str, after: int, limit: int) -> Any:
        raise self._refuse("thread_read")

    async def thread_wait(self, caller: Caller, thread_id: str, **options: Any) -> Any:
        raise self._refuse("thread_wait")

    async def thread_interrupt(self, caller: Caller, thread_id: str, stop: bool) -> Any:
        raise self._refuse("thread_interrupt")

    async def thread_list(self, caller: Caller) -> Any:
        raise self._refuse("thread_list")
