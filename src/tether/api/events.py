"""``/api/events``: every state change, in store order, as Server-Sent Events.

Resumable: ``Last-Event-ID`` or ``?after=ID`` continues after that event; no cursor starts
at the oldest stored event; ``?after=now`` gives only new ones. ``?types=task.,link.added``
sends only events of those types (an entry ending in ``.`` is a prefix): a link's follower
reads only ``task.`` events, a quarter of a remote child's. A link token sees only the
events of what it created (G10), and reading from a cursor acknowledges everything up to it.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse

from tether.api.auth import caller, environment_dependency
from tether.codec import dumps
from tether.environment import Environment
from tether.errors import Invalid
from tether.store.base import Event
from tether.types import Caller

router = APIRouter(tags=["events"])
_KEEPALIVE = 15.0
#: One entry of ``?types=``: an event type (``task.updated``) or a prefix (``task.``).
_TYPE = re.compile(r"[a-z][a-z_]*(\.[a-z_]+)*\.?")
_MAX_TYPES = 16


def _envelope(event: Event, environment_id: str) -> dict[str, Any]:
    return {
        "id": event.id,
        "type": event.type,
        "at": event.at,
        "environmentId": environment_id,
        "threadId": event.thread_id,
        "runId": event.run_id,
        "taskId": event.task_id,
    }


def event_json(event: Event, environment_id: str) -> dict[str, Any]:
    return {**_envelope(event, environment_id), "data": event.data}


def _frame(event: Event, environment_id: str) -> str:
    """``event_json`` as an SSE frame, with the data spliced in as stored: a busy feed spent
    a tenth of its time decoding and encoding again what it only passes on. (Encoded JSON
    is one line — see ``tether.codec`` — so it cannot break the frame.)"""
    data = f"{dumps(_envelope(event, environment_id))[:-1]},\"data\":{event.text}}}"
    return f"id: {event.id}\nevent: {event.type}\ndata: {data}\n\n"


def _cursor(env: Environment, after: str | None, last_event_id: str | None) -> int:
    raw = after if after is not None else last_event_id
    if raw is None or raw == "":
        return 0
    if raw == "now":
        return env.store.last_event_seq()
    if not raw.isdigit() or len(raw) > 18:
        raise Invalid(f"event cursor must be an event id or 'now', not {raw!r}")
    newest = env.store.last_event_seq()
    if int(raw) > newest:
        raise Invalid(f"event cursor {raw} is past the newest event ({newest})")
    return int(raw)


def _types(raw: str | None) -> tuple[str, ...]:
    if raw is None:
        return ()
    types = tuple(raw.split(","))
    if len(types) > _MAX_TYPES:
        raise Invalid(f"types takes at most {_MAX_TYPES} entries, not {len(types)}")
    for kind in types:
        if len(kind) > 64 or not _TYPE.fullmatch(kind):
            raise Invalid(f"types: {kind[:64]!r} is not an event type or a prefix ending in '.'")
    return types


@router.get("/api/events")
async def events(
    request: Request,
    who: Annotated[Caller, Depends(caller)],
    env: Annotated[Environment, Depends(environment_dependency)],
    after: str | None = None,
    keepalive: Annotated[float, Query(ge=0.1, le=60)] = _KEEPALIVE,
    types: Annotated[
        str | None, Query(description="Comma-separated event types; an entry ending in '.' is a prefix")
    ] = None,
) -> StreamingResponse:
    kinds = _types(types)
    cursor = _cursor(env, after, request.headers.get("last-event-id"))
    token = who.token_id if who.kind == "link" else None
    if token is not None and cursor:
        env.tokens.acknowledge(token, cursor)
    if who.kind == "thread":
        token = "-"  # a thread credential reads its thread through the tools, not the feed

    async def stream() -> AsyncIterator[str]:
        nonlocal cursor
        yield ": tether event feed\n\n"
        # No is_disconnected() poll here: the response already ends this generator when the
        # client goes (Starlette listens for the disconnect beside it, or the write fails).
        while True:
            if token is not None and who.kind == "link" and not env.tokens.active(token):
                return  # revoked: the stream ends now, and the reconnect gets 401
            top = env.store.last_event_seq()
            batch = env.store.events_after(cursor, 500, token, kinds)
            if batch:
                # One write for the batch: a follower receives what one commit wrote in
                # one chunk, and applies it in one transaction.
                cursor = batch[-1].seq
                yield "".join(_frame(event, env.environment_id) for event in batch)
                continue
            cursor = max(cursor, top)  # nothing (of this token's) up to the newest event
            seen = cursor
            woke = await env.runtime.notifier.wait_until(
                ["events"], lambda seen=seen: True if env.store.last_event_seq() > seen else None, keepalive
            )
            if woke is None:
                yield ": keepalive\n\n"

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
