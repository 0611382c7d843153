"""Links to other environments, and following them.

A link is one-way: this environment (the origin) opens every connection to the peer (the
destination), which may sit behind NAT. Per link, two tasks run:

- the **follower** streams the peer's event feed from the stored cursor and applies the
  task events of each received chunk in one transaction with the cursor move, so a
  duplicate or replayed event changes nothing and an outage only delays (G3, G7). A
  stream that stays silent longer than a few keepalive periods is treated as dead, so a
  blackholed connection is dropped and retried instead of hanging.
- the **pusher** delivers calls the peer must receive even if it is down right now
  (creating a remote child, cancelling one). They are durable marks on the task
  (``remote_pending``), retried at most 1 s apart until the peer answers.

Interactive calls (send, read, wait, interrupt, list) go straight to the peer with an
idempotency key, retried for a short while, and fail with ``unreachable`` after that.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx

from tether.a2a import available as a2a_available
from tether.domain.records import Link, Send, Task
from tether.errors import Conflict, Invalid, NotFound, TetherError, Unavailable
from tether.ids import now
from tether.store.base import OutboxRow
from tether.types import Caller

if TYPE_CHECKING:
    from tether.environment import Environment

log = logging.getLogger(__name__)

RETRY_MAX = 0.5  # G7: the origin retries at most 1 s apart (we use half)
KEEPALIVE = 0.25  # seconds between keepalives we ask the peer for; 4 missed: the stream is dead
CALL_DEADLINE = 10.0  # how long an interactive call keeps retrying
SEND_WAIT = 5.0  # how long thread_send waits for the peer before answering "pending"


def check_url(url: str, insecure: bool) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Invalid(f"{url!r} is not an http(s) URL")
    if parts.scheme == "http" and not insecure and not _private(parts.hostname):
        raise Invalid(
            "plain http is accepted only for loopback and private addresses; use https or --insecure"
        )
    return url.rstrip("/")


def _private(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_private


def _error(response: httpx.Response) -> TetherError:
    try:
        body = response.json()["error"]
        message, code = body["message"], body["code"]
    except (ValueError, KeyError, TypeError):
        message, code = response.text[:200], None
    classes = {401: Unavailable, 403: TetherError, 404: NotFound, 409: Conflict}
    error = classes.get(response.status_code, Invalid)(f"peer answered {response.status_code}: {message}")
    if response.status_code == 401:
        error.code = "link_revoked"
    elif code:
        error.code = code
    if response.status_code == 403:
        error.status = 403
    return error


def _sse_events(buffer: str) -> tuple[list[tuple[int, dict[str, Any]]], str]:
    """The complete events in ``buffer`` of Server-Sent Events (a frame ends with a blank
    line), as ``(id, data)``, and the incomplete rest to prepend to the next chunk. Frames
    without an id or data (keepalive comments) are skipped."""
    *frames, rest = buffer.replace("\r\n", "\n").split("\n\n")
    events = []
    for frame in frames:
        event_id, data = None, []
        for line in frame.split("\n"):
            if line.startswith("id:"):
                event_id = line[3:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        if data and event_id is not None:
            events.append((int(event_id), json.loads("\n".join(data))))
    return events, rest


class Peer:
    """One link: the calls we make to that environment, and the tasks that follow it."""

    def __init__(self, peers: Peers, link: Link) -> None:
        self.peers = peers
        self.environment_id = link.environment_id
        self.link = link
        self.http = httpx.AsyncClient(
            base_url=link.url,
            headers={"Authorization": f"Bearer {link.token}"},
            timeout=httpx.Timeout(5.0, connect=1.0),
        )
        self._push = asyncio.Event()
        self._seen = "0"
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def commands(self) -> Any:
        return self.peers.env.commands

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
        await self.http.aclose()

    def kick(self) -> None:
        self._push.set()

    # ------------------------------------------------------------------ status

    def _status(self, status: str, error: str | None) -> None:
        if (self.link.status, self.link.last_error) == (status, error):
            return
        with self.peers.env.store.transaction() as tx:
            link = tx.get(Link, self.environment_id)
            if link is None:
                return
            link.status, link.last_error = status, error
            tx.put(link)
            self.link = link

    def view(self) -> dict[str, Any]:
        with self.peers.env.store.read() as reader:
            self.link = reader.get(Link, self.environment_id) or self.link
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
        with self.peers.env.store.read() as reader:
            link = reader.get(Link, self.environment_id)
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
        params = {"after": self._seen, "keepalive": str(KEEPALIVE)}
        timeout = httpx.Timeout(KEEPALIVE * 4, connect=1.0)
        async with self.http.stream("GET", "/api/events", params=params, timeout=timeout) as response:
            if response.status_code != 200:
                await response.aread()
                raise _error(response)
            self._status("ok", None)
            self.kick()  # a (re)connected peer may have pending calls for it
            rest = ""
            async for text in response.aiter_text():
                events, rest = _sse_events(rest + text)
                if events:
                    self._apply(events)
                    self._seen = str(events[-1][0])
        raise httpx.StreamError("the peer closed the event stream")

    def _apply(self, events: list[tuple[int, dict[str, Any]]]) -> None:
        """The task events of one received chunk, in one transaction with the cursor."""
        news = [
            (seq, event["data"])
            for seq, event in events
            if event["type"].startswith("task.") and isinstance(event.get("data"), dict)
        ]
        if news:
            self.commands.apply_remote_chunk(self.environment_id, news)

    # ------------------------------------------------------------------ durable pushes

    async def _pusher(self) -> None:
        """Carry out this link's durable calls (remote creates, cancels, sends) when kicked,
        and every ``RETRY_MAX`` while some are left. Supervised: whatever fails is logged
        and retried (the tasks stay visibly ``pending``) — it never ends but by ``close()``, since a pusher
        that died would leave every later remote task ``pending`` for good."""
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
        with self.peers.env.store.read() as reader:
            pending = [
                t
                for t in reader.find(Task, remote_pending=["create", "cancel"])
                if t.child_environment_id == self.environment_id
            ]
            sends = reader.find(Send, environment_id=self.environment_id, status="pending")
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
        for task in pending:
            try:
                await (self._create(task) if task.remote_pending == "create" else self._cancel(task))
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

    async def _create(self, task: Task) -> None:
        request = task.remote_request or {}
        body = {
            "taskId": task.id,
            "task": request.get("task", ""),
            "provider": request.get("provider"),
            "model": request.get("model"),
            "title": task.title,
            "hold": task.hold,
            "mode": task.mode,
            "origin": {
                "environmentId": self.peers.env.environment_id,
                "threadId": task.parent_thread_id,
                "taskId": task.id,
            },
        }
        response = await self.http.post("/api/tasks", json=body)
        if response.status_code in (200, 201):
            self.commands.remote_sent(task.id, response.json().get("childThreadId"))
        elif response.status_code == 409:  # created before; our answer was lost
            existing = await self.http.get(f"/api/tasks/{task.id}")
            if existing.status_code != 200:  # not readable yet: retried, never left pending
                raise httpx.TransportError(f"peer answered {existing.status_code} for task {task.id}")
            self.commands.remote_sent(task.id, existing.json().get("childThreadId"))
        elif response.status_code == 401 or response.status_code >= 500:
            raise _error(response) if response.status_code == 401 else httpx.TransportError("peer error")
        else:
            self.commands.remote_refused(task.id, _error(response).message)

    async def _cancel(self, task: Task) -> None:
        response = await self.http.post(
            f"/api/tasks/{task.id}/cancel", json={"reason": task.cancel_reason or "cancelled by origin"}
        )
        if response.status_code == 401:
            raise _error(response)
        if response.status_code >= 500:
            raise httpx.TransportError("peer error")
        self.commands.remote_sent(task.id)

    # ------------------------------------------------------------------ tool calls

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        """One interactive call, retried on transport errors for up to CALL_DEADLINE."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CALL_DEADLINE
        delay = 0.1
        while True:
            try:
                response = await self.http.request(method, path, **kwargs)
                if response.status_code < 400:
                    return response.json()
                if response.status_code < 500:
                    raise _error(response)
            except httpx.TransportError as error:
                if loop.time() + delay > deadline:
                    raise Unavailable(
                        f"environment {self.link.name} unreachable: {error}", "unreachable"
                    ) from None
            else:
                if loop.time() + delay > deadline:
                    raise Unavailable(
                        f"environment {self.link.name} answered {response.status_code}", "unreachable"
                    )
            await asyncio.sleep(delay)
            delay = min(RETRY_MAX, delay * 2)

    def _origin(self, caller: Caller) -> dict[str, Any]:
        return {"environmentId": self.peers.env.environment_id, "threadId": caller.thread_id}

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
        error = _error(response)
        self.commands.send_done(send.id, error=error.message)
        raise error

    async def thread_read(self, caller: Caller, thread_id: str, after: int, limit: int) -> dict[str, Any]:
        return await self._call(
            "GET", f"/api/threads/{thread_id}/messages", params={"afterPosition": after, "limit": limit}
        )

    async def thread_wait(self, caller: Caller, thread_id: str, **options: Any) -> dict[str, Any]:
        params = {k: v for k, v in options.items() if v is not None}
        timeout = (options.get("timeoutMs") or 30_000) / 1000 + 5
        return await self._call(
            "GET",
            f"/api/threads/{thread_id}/wait",
            params=params,
            timeout=httpx.Timeout(timeout, connect=1.0),
        )

    async def thread_interrupt(self, caller: Caller, thread_id: str, stop: bool) -> dict[str, Any]:
        return await self._call("POST", f"/api/threads/{thread_id}/interrupt", json={"stop": stop})

    async def thread_list(self, caller: Caller) -> dict[str, Any]:
        found = await self._call("GET", "/api/threads")
        return {"environmentId": self.environment_id, "threads": found["threads"]}


class Peers:
    """All links of one environment."""

    def __init__(self, env: Environment) -> None:
        self.env = env
        self.peers: dict[str, Peer] = {}
        self._started = False
        env.runtime.add_handler("peer.push", self._on_push)

    async def start(self) -> None:
        self._started = True
        with self.env.store.read() as reader:
            links = reader.find(Link)
        for link in links:
            self._open(link)

    async def close(self) -> None:
        self._started = False
        for peer in list(self.peers.values()):
            await peer.close()
        self.peers.clear()

    def _open(self, link: Link) -> Peer:
        if link.kind == "a2a":
            from tether.peers.a2a import A2APeer  # needs the optional a2a-sdk

            peer: Peer = A2APeer(self, link)
        else:
            peer = Peer(self, link)
        self.peers[link.environment_id] = peer
        if self._started:
            peer.start()
        return peer

    def _on_push(self, row: OutboxRow) -> None:
        peer = self.peers.get(row.payload.get("environmentId", ""))
        if peer is not None:
            peer.kick()

    def list(self) -> list[dict[str, Any]]:
        return [peer.view() for peer in self.peers.values()]

    def resolve(self, ref: str | None) -> Peer:
        """A linked environment by id, by its own name, or by the link's label."""
        if ref in self.peers:
            return self.peers[ref]
        found = [p for p in self.peers.values() if ref in (p.link.name, p.link.label)]
        if len(found) > 1:
            raise Conflict(f"{ref!r} names more than one linked environment; use its environmentId")
        if not found:
            raise NotFound(f"no linked environment {ref!r}")
        return found[0]

    async def add(
        self,
        url: str,
        token: str | None,
        label: str | None = None,
        insecure: bool = False,
        kind: str = "tether",
    ) -> dict[str, Any]:
        """Link to the tether environment at ``url`` (``kind`` "tether", with a token minted
        there) or to the A2A agent there (``kind`` "a2a", named by its card unless ``label``
        names it; its token, if it needs one, is sent as a Bearer token)."""
        url = check_url(url, insecure)
        if kind == "a2a":
            if not a2a_available():
                raise Invalid("A2A links need the a2a extra: pip install 'tether[a2a]'")
            from tether.peers.a2a import identity

            environment_id, name = await identity(url, token, label)
        elif kind == "tether" and token:
            environment_id, name = await self._identity(url, token)
        else:
            raise Invalid("a link to a tether environment needs a link token minted there (--token)")
        with self.env.store.transaction() as tx:
            link = tx.get(Link, environment_id)
            if link is None:
                link = Link(environment_id, name, url, token or "", now(), label, kind=kind)
            else:
                link.name, link.url, link.token, link.label = name, url, token or "", label or link.label
            link.status, link.last_error = "ok", None
            tx.put(link)
        old = self.peers.pop(environment_id, None)
        if old is not None:
            await old.close()
        peer = self._open(link)
        return peer.view()

    async def _identity(self, url: str, token: str) -> tuple[str, str]:
        """The tether environment at ``url``: its id and name, once it took the token."""
        async with httpx.AsyncClient(timeout=5.0) as client:
            try:
                health = (await client.get(f"{url}/api/health")).json()
                environment_id, name = health["environmentId"], health["name"]
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                raise Invalid(f"{url} does not answer as a tether environment") from None
            if environment_id == self.env.environment_id:
                raise Conflict("refusing to link this environment to itself")
            probe = await client.get(f"{url}/api/threads", headers={"Authorization": f"Bearer {token}"})
            if probe.status_code == 401:
                raise Invalid(f"{url} refused the token (unknown or revoked)")
        return environment_id, name
