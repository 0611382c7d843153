"""``/api/events``: every state change, in store order, as Server-Sent Events.

Resumable: ``Last-Event-ID`` or ``?after=ID`` continues after that event; no cursor starts
at the oldest stored event; ``?after=now`` gives only new ones. A link token sees only the
events of what it created (G10), and reading from a cursor acknowledges everything up to it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from tether.api.auth import caller, environment
from tether.environment import Environment
from tether.errors import Invalid
from tether.store.base import Event
from tether.types import Caller

router = APIRouter(tags=["events"])
_KEEPALIVE = 15.0


def event_json(event: Event, environment_id: str) -> dict[str, Any]:
    return {
        "id": event.id,
        "type": event.type,
        "at": event.at,
        "environmentId": environment_id,
        "threadId": event.thread_id,
        "runId": event.run_id,
        "taskId": event.task_id,
        "data": event.data,
    }


def _cursor(env: Environment, after: str | None, last_event_id: str | None) -> int:
    raw = after if after is not None else last_event_id
    if raw is None or raw == "":
        return 0
    if raw == "now":
        return env.store.last_event_seq()
    if not raw.isdigit():
        raise Invalid(f"event cursor must be an event id or 'now', not {raw!r}")
    return int(raw)


@router.get("/api/events")
async def events(request: Request, who: Annotated[Caller, Depends(caller)],
                 env: Annotated[Environment, Depends(environment)],
                 after: str | None = None) -> StreamingResponse:
    cursor = _cursor(env, after, request.headers.get("last-event-id"))
    token = who.token_id if who.kind == "link" else None
    if who.kind == "thread":
        token = "-"  # a thread credential reads its thread through the tools, not the feed

    async def stream() -> AsyncIterator[str]:
        nonlocal cursor
        yield ": tether event feed\n\n"
        while not await request.is_disconnected():
            batch = env.store.events_after(cursor, 500, token)
            for event in batch:
                cursor = event.seq
                yield f"id: {event.id}\nevent: {event.type}\ndata: {json.dumps(event_json(event, env.environment_id))}\n\n"
            if batch:
                continue
            woke = await env.runtime.notifier.wait_until(
                ["events"], lambda: True if env.store.last_event_seq() > cursor else None, _KEEPALIVE
            )
            if woke is None:
                yield ": keepalive\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
