"""The one HTTP client to a linked environment.

Everything that talks to a peer — the follower, the pusher, a thread's tool calls, the
web page — goes through :class:`PeerClient`, so an answer means the same everywhere: a
refusal becomes the :class:`~tether.errors.TetherError` the peer named, an unreachable
peer becomes ``Unavailable`` ("unreachable"), and the event feed is read by one parser.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx

from tether.codec import loads
from tether.errors import Conflict, Invalid, NotFound, TetherError, Unavailable

RETRY_MAX = 0.5  # G7: the origin retries at most 1 s apart (we use half)
CALL_DEADLINE = 10.0  # how long an interactive call keeps retrying
#: A call's timeouts: a peer that takes longer is retried (pushes) or shown as slow (page).
TIMEOUT = httpx.Timeout(5.0, connect=1.0)

Event = tuple[int, dict[str, Any]]


def error_of(response: httpx.Response) -> TetherError:
    """The peer's refusal as our error: its code and message, with 401 meaning our link
    token is no longer accepted (``link_revoked``)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    return error_from(response.status_code, body, response.text)


def error_from(status: int, body: Any, text: str = "") -> TetherError:
    """``error_of`` for an answer already read: a status and its JSON body (``{"error":
    {code, message}}``), or the text when the body is not that."""
    try:
        message, code = body["error"]["message"], body["error"]["code"]
    except (KeyError, TypeError):
        message, code = text[:200], None
    classes = {401: Unavailable, 403: TetherError, 404: NotFound, 409: Conflict}
    error = classes.get(status, Invalid)(f"peer answered {status}: {message}")
    if status == 401:
        error.code = "link_revoked"
    elif code:
        error.code = code
    if status == 403:
        error.status = 403
    return error


def sse_events(buffer: str) -> tuple[list[Event], str]:
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
            events.append((int(event_id), loads("\n".join(data))))
    return events, rest


class PeerClient:
    """HTTP to one peer with the link's token (or none: an A2A agent may need none)."""

    def __init__(self, url: str, token: str | None, name: str) -> None:
        self.name = name
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.AsyncClient(base_url=url, headers=headers, timeout=TIMEOUT)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def once(self, method: str, path: str, timeout: float | None = None, **kwargs: Any) -> Any:
        """One call, not retried (the page shows a slow peer rather than wait on it)."""
        try:
            response = await self.http.request(method, path, timeout=timeout or TIMEOUT, **kwargs)
        except httpx.HTTPError as error:
            raise Unavailable(f"{self.name} is unreachable: {type(error).__name__}", "unreachable") from None
        if response.status_code >= 400:
            raise error_of(response)
        return response.json()

    async def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """An interactive call (a tool's), retried on transport errors and 5xx answers for
        up to ``CALL_DEADLINE``; then ``Unavailable``. A 4xx is the peer's answer: raised."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CALL_DEADLINE
        delay = 0.1
        while True:
            try:
                response = await self.http.request(method, path, **kwargs)
                if response.status_code < 400:
                    return response.json()
                if response.status_code < 500:
                    raise error_of(response)
                problem = f"answered {response.status_code}"
            except httpx.TransportError as error:
                problem = f"unreachable: {error}"
            if loop.time() + delay > deadline:
                raise Unavailable(f"environment {self.name} {problem}", "unreachable")
            await asyncio.sleep(delay)
            delay = min(RETRY_MAX, delay * 2)

    async def feed(
        self, after: str, keepalive: float, timeout: float, types: str | None = None
    ) -> AsyncIterator[list[Event]]:
        """The peer's event feed from ``after``: first an empty list once connected, then
        each received chunk's complete events (empty for a chunk that only kept the stream
        alive). ``types`` asks for only those (``?types=``; a peer that predates it sends
        every event). ``timeout`` bounds the silence between chunks: a dead stream raises
        instead of hanging. A refusal raises the peer's error; the peer closing it,
        ``StreamError``."""
        params = {"after": after, "keepalive": str(keepalive)} | ({"types": types} if types else {})
        async with self.http.stream(
            "GET", "/api/events", params=params, timeout=httpx.Timeout(timeout, connect=1.0)
        ) as response:
            if response.status_code != 200:
                await response.aread()
                raise error_of(response)
            yield []
            rest = ""
            async for text in response.aiter_text():
                events, rest = sse_events(rest + text)
                yield events
        raise httpx.StreamError("the peer closed the event stream")
