"""One link to another environment: following it, pushing to it, calling it.

A link is one-way: this environment (the origin) opens every connection to the peer (the
destination), which may sit behind NAT. Per link, two tasks run:

- the **follower** streams the peer's event feed from the stored cursor and applies the
  task events of each received chunk in one transaction with the cursor move, so a
  duplicate or replayed event changes nothing and an outage only delays (G3, G7). A
  stream that stays silent longer than a few keepalive periods is treated as dead, so a
  blackholed connection is dropped and retried instead of hanging.
- the **pusher** delivers calls the peer must receive even if it is down right now
  (creating a remote child, cancelling one, a message). They are durable marks on the
  task (``remote_pending``) or queued sends, retried at most 1 s apart until the peer
  answers.

Interactive calls (send, read, wait, interrupt, list) go straight to the peer with an
idempotency key, retried for a short while, and fail with ``unreachable`` after that.
Both tasks are supervised: whatever fails is logged and retried, never their end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from tether.domain.records import Link, Send, Task
from tether.engine.commands import Commands
from tether.errors import Invalid, TetherError, Unavailable
from tether.peers.client import RETRY_MAX, Event, PeerClient, error_from, error_of
from tether.types import Caller

log = logging.getLogger(__name__)

#: Tasks per ``POST /api/tasks/batch`` (the peer takes at most 50), and about the most
#: task text in one (a request may carry 1 MB).
BATCH = 50
BATCH_TEXT = 256 * 1024
KEEPALIVE = 0.25  # seconds between keepalives we ask the peer for; 4 missed: the stream is dead
#: The only events a follower applies (``_apply``): the feed is asked for these alone.
_FOLLOWED = "task."
SEND_WAIT = 5.0  # how long thread_send waits for the peer before answering "pending"


@dataclass(frozen=True)
class Origin:
    """What a link uses of the environment it belongs to — and nothing else of it."""

    environment_id: str
    commands: Commands
    config: Mapping[str, Any]


class Peer:
    """One link: the calls we make to that environment, and the tasks that follow it."""

    def __init__(self, origin: Origin, link: Link) -> None:
        self.origin = origin
        self.commands = origin.commands
        self.environment_id = link.environment_id
        self.link = link
        self.client = PeerClient(link.url, link.token or None, link.name)
        self.http = self.client.http
        self._push = asyncio.Event()
        self._seen = "0"
        self._tasks: list[asyncio.Task[None]] = []
        #: Whether the peer takes ``POST /api/tasks/batch`` (an older tether answers 404;
        #: an A2A agent is asked one task at a time).
        self._batching = True

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._follow(), name=f"follow {self.environment_id}"),
            asyncio.create_task(self._pusher(), name=f"push {self.environment_id}"),
        ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.client.aclose()

    def kick(self) -> None:
        self._push.set()

    # ------------------------------------------------------------------ status

    def _status(self, status: str, error: str | None) -> None:
        if (self.link.status, self.link.last_error) != (status, error):
            self.link = self.commands.link_status(self.environment_id, status, error) or self.link

    def view(self) -> dict[str, Any]:
        with self.commands.view() as u:
            self.link = u.load(Link, self.environment_id) or self.link
        return {
            "environmentId": self.link.environment_id,
            "name": self.link.name,
            "label": self.link.label,
            "url": self.link.url,
            "status": self.link.status,
            "lastError": self.link.last_error,
            "cursor": self.link.cursor,
            "kind": self.link.kind,
        }

    # ------------------------------------------------------------------ following (G7)

    def _cursor(self) -> str:
        with self.commands.view() as u:
            link = u.load(Link, self.environment_id)
        return (link.cursor if link else None) or "0"

    async def _follow(self) -> None:
        delay = 0.1
        self._seen = self._cursor()
        while True:
            try:
                await self._stream()
            except (httpx.TransportError, httpx.StreamError) as error:
                self._status(
                    "unreachable", f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
                )
            except TetherError as error:
                revoked = error.code == "link_revoked"
                self._status("revoked" if revoked else "error", error.message)
                if revoked:
                    self.commands.link_revoked(self.environment_id, f"link to {self.link.name} revoked")
            except Exception as error:  # never let the follower die
                log.exception("following %s failed", self.environment_id)
                self._status("error", str(error))
            await asyncio.sleep(delay)  # reconnect backoff, capped at RETRY_MAX
            delay = min(RETRY_MAX, delay * 2)

    async def _stream(self) -> None:
        connected = False
        feed_of_tasks = self.client.feed(self._seen, KEEPALIVE, KEEPALIVE * 4, types=_FOLLOWED)
        async with contextlib.aclosing(feed_of_tasks) as feed:
            async for events in feed:
                if not connected:
                    connected = True
                    self._status("ok", None)
                    self.kick()  # a (re)connected peer may have pending calls for it
                if events:
                    self._apply(events)
                    self._seen = str(events[-1][0])

    def _apply(self, events: list[Event]) -> None:
        """The task events of one received chunk, in one transaction with the cursor (the
        feed sends only those, unless the peer predates ``?types=``)."""
        news = [
            (seq, event["data"])
            for seq, event in events
            if event["type"].startswith(_FOLLOWED) and isinstance(event.get("data"), dict)
        ]
        if news:
            self.commands.apply_remote_chunk(self.environment_id, news)

    # ------------------------------------------------------------------ durable pushes

    async def _pusher(self) -> None:
        """Carry out this link's durable calls (remote creates, cancels, sends) when kicked,
        and every ``RETRY_MAX`` while some are left. Supervised: whatever fails is logged
        and retried (the tasks stay visibly ``pending``); it ends only by ``close()``, since
        a pusher that died would leave every later remote task ``pending`` for good."""
        while True:
            self._push.clear()
            try:
                left = await self._push_pending()
            except Exception:
                log.exception("pushing to %s failed; retrying", self.environment_id)
                left = 1
            timeout = RETRY_MAX if left else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._push.wait(), timeout)

    async def _push_pending(self) -> int:
        """Try every pending call once; the number still pending (to retry soon)."""
        with self.commands.view() as u:
            pending = [
                t
                for t in u.query(Task, remote_pending=["create", "cancel"])
                if t.child_environment_id == self.environment_id
            ]
            sends = u.query(Send, environment_id=self.environment_id, status="pending")
        left = 0
        for send in sends:
            try:
                await self._send(send)
            except Unavailable:
                left += 1
            except TetherError:
                pass  # refused for good: recorded as failed by _send
            except Exception as error:
                left += 1
                self._push_failed(send.id, error)
        creates = [task for task in pending if task.remote_pending == "create"]
        for batch in _batches(creates):
            try:
                await self._create_all(batch)
            except Exception as error:
                left += len(batch)
                self._push_failed(", ".join(task.id for task in batch), error)
        for task in pending:
            if task.remote_pending == "cancel":
                try:
                    await self._cancel(task)
                except Exception as error:
                    left += 1
                    self._push_failed(task.id, error)
        return left

    def _push_failed(self, what: str, error: Exception) -> None:
        """A call not (yet) carried out: expected ones (the peer unreachable or busy) are
        noted; anything else is a bug to see in the log — both are retried."""
        if isinstance(error, httpx.TransportError | Unavailable):
            log.info("peer %s not reached for %s: %s", self.environment_id, what, error)
        else:
            log.exception("pushing %s to %s failed; retrying", what, self.environment_id)

    async def _create_all(self, batch: list[Task]) -> None:
        """Hand the peer its new tasks: several in one ``POST /api/tasks/batch``, each
        answered on its own; one at a time (``_create``) to a peer without that endpoint
        (an older tether) or when a batch is refused whole (then each alone says which)."""
        if len(batch) > 1 and self._batching:
            bodies = [self._body(task) for task in batch]
            response = await self.http.post("/api/tasks/batch", json={"tasks": bodies})
            if response.status_code == 200:
                for task, result in zip(batch, response.json()["results"], strict=True):
                    await self._created(task, result["status"], result.get("task") or result)
                return
            if response.status_code in (404, 405):
                self._batching = False
            elif response.status_code == 401 or response.status_code >= 500:
                raise _failure(response)
        for task in batch:
            await self._create(task)

    async def _create(self, task: Task) -> None:
        response = await self.http.post("/api/tasks", json=self._body(task))
        if response.status_code == 401 or response.status_code >= 500:
            raise _failure(response)
        await self._created(task, response.status_code, _answer(response))

    async def _created(self, task: Task, status: int, answer: dict[str, Any]) -> None:
        """The peer's answer for one task: created, created before (our answer was lost),
        or refused for good."""
        if status in (200, 201):
            self.commands.remote_sent(task.id, answer.get("childThreadId"))
        elif status == 409:
            existing = await self.http.get(f"/api/tasks/{task.id}")
            if existing.status_code != 200:  # not readable yet: retried, never left pending
                raise httpx.TransportError(f"peer answered {existing.status_code} for task {task.id}")
            self.commands.remote_sent(task.id, existing.json().get("childThreadId"))
        else:
            self.commands.remote_refused(task.id, error_from(status, answer, str(answer)).message)

    def _body(self, task: Task) -> dict[str, Any]:
        request = task.remote_request or {}
        return {
            "taskId": task.id,
            "task": request.get("task", ""),
            "provider": request.get("provider"),
            "model": request.get("model"),
            "title": task.title,
            "hold": task.hold,
            "mode": task.mode,
            "origin": {
                "environmentId": self.origin.environment_id,
                "threadId": task.parent_thread_id,
                "taskId": task.id,
            },
        }

    async def _cancel(self, task: Task) -> None:
        response = await self.http.post(
            f"/api/tasks/{task.id}/cancel", json={"reason": task.cancel_reason or "cancelled by origin"}
        )
        if response.status_code == 401:
            raise error_of(response)
        if response.status_code >= 500:
            raise httpx.TransportError("peer error")
        self.commands.remote_sent(task.id, call="cancel")

    # ------------------------------------------------------------------ tool calls

    def _origin(self, caller: Caller) -> dict[str, Any]:
        return {"environmentId": self.origin.environment_id, "threadId": caller.thread_id}

    async def delegate(self, caller: Caller, task: str, **options: Any) -> dict[str, Any]:
        view = self.commands.delegate_remote(caller, self.environment_id, task, **options)
        self.kick()
        return view

    async def thread_send(
        self,
        caller: Caller,
        thread_id: str,
        message: str,
        mode: str = "auto",
        client_request_id: str | None = None,
    ) -> dict[str, Any]:
        """Kept first, then sent: with the link up the peer's answer comes back at once;
        with it down the call answers ``delivery: "pending"`` and the message flows, once,
        when the link heals (G7)."""
        send = self.commands.queue_send(
            caller, self.environment_id, thread_id, message, mode, client_request_id
        )
        if send.status == "sent" and send.result is not None:
            return send.result
        if send.status == "failed":
            raise Invalid(send.error or "the peer refused the message")
        try:
            return await asyncio.wait_for(self._send(send), SEND_WAIT)
        except (httpx.TransportError, Unavailable, TimeoutError):
            self.kick()
            return {"messageId": None, "runId": None, "delivery": "pending", "sendId": send.id}

    async def _send(self, send: Send) -> dict[str, Any]:
        body = {"text": send.text, "mode": send.mode, "origin": send.origin, "clientRequestId": send.id}
        response = await self.http.post(f"/api/threads/{send.thread_id}/messages", json=body)
        if response.status_code < 300:
            result = response.json()
            self.commands.send_done(send.id, result)
            return result
        if response.status_code == 401 or response.status_code >= 500:
            raise Unavailable(f"environment {self.link.name} answered {response.status_code}", "unreachable")
        error = error_of(response)
        self.commands.send_done(send.id, error=error.message)
        raise error

    async def thread_read(self, caller: Caller, thread_id: str, after: int, limit: int) -> dict[str, Any]:
        return await self.client.call(
            "GET", f"/api/threads/{thread_id}/messages", params={"afterPosition": after, "limit": limit}
        )

    async def thread_wait(self, caller: Caller, thread_id: str, **options: Any) -> dict[str, Any]:
        params = {k: v for k, v in options.items() if v is not None}
        timeout = (options.get("timeoutMs") or 30_000) / 1000 + 5
        return await self.client.call(
            "GET",
            f"/api/threads/{thread_id}/wait",
            params=params,
            timeout=httpx.Timeout(timeout, connect=1.0),
        )

    async def thread_interrupt(self, caller: Caller, thread_id: str, stop: bool) -> dict[str, Any]:
        return await self.client.call("POST", f"/api/threads/{thread_id}/interrupt", json={"stop": stop})

    async def thread_list(self, caller: Caller) -> dict[str, Any]:
        found = await self.client.call("GET", "/api/threads")
        return {"environmentId": self.environment_id, "threads": found["threads"]}


def _batches(tasks: list[Task]) -> list[list[Task]]:
    """``tasks`` in order, cut into requests of at most ``BATCH`` tasks and about
    ``BATCH_TEXT`` of task text (a bigger task goes alone)."""
    batches: list[list[Task]] = []
    size = 0
    for task in tasks:
        text = len((task.remote_request or {}).get("task", ""))
        if not batches or len(batches[-1]) == BATCH or size + text > BATCH_TEXT:
            batches.append([])
            size = 0
        batches[-1].append(task)
        size += text
    return batches


def _answer(response: httpx.Response) -> dict[str, Any]:
    """The JSON object of an answer; for a refusal that is not JSON, its text as the error.
    A success that cannot be read raises (it is asked again, never taken as done)."""
    try:
        body = response.json()
    except ValueError:
        if response.is_success:
            raise
        return {"error": {"code": None, "message": response.text[:200]}}
    return body if isinstance(body, dict) else {}


def _failure(response: httpx.Response) -> Exception:
    """An answer that says "try again": our token refused (shown as the link's state) or
    the peer failing."""
    if response.status_code == 401:
        return error_of(response)
    return httpx.TransportError(f"peer answered {response.status_code}")
