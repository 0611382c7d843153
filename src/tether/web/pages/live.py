"""The live feed: after every batch of events, the fragments they changed, re-rendered
from the store (so a replayed or late event doubles nothing)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import (
    StreamingResponse,
)

from tether.api.events import event_json
from tether.environment import Environment
from tether.errors import Invalid, NotFound, TetherError
from tether.web import model, remote
from tether.web.pages.common import (
    context,
    guard,
    stamp,
)
from tether.web.pages.environments import LINK_WATCH, LinkWatch
from tether.web.pages.threads import (
    env_summary,
    local_context,
    local_page,
    local_row,
    remote_context,
    remote_page,
)
from tether.web.render import fragment as make_fragment
from tether.web.render import row_fragment, thread_fragments

router = APIRouter(include_in_schema=False)
KEEPALIVE = 15.0


def _live_cursor(env: Environment, after: str | None, last_event_id: str | None) -> int:
    newest = env.store.last_event_seq()
    cursor = 0
    for raw in (after, last_event_id):
        if raw is None or raw == "":
            continue
        if raw == "now":
            value = newest
        elif raw.isdigit() and len(raw) <= 18:
            value = int(raw)
        else:
            raise Invalid(f"event cursor must be an event id or 'now', not {raw!r}")
        cursor = max(cursor, value)
    return cursor


def _frame(kind: str, cursor: int, data: dict[str, Any]) -> str:
    return f"event: {kind}\nid: {cursor}\ndata: {json.dumps(data)}\n\n"


async def _live_fragments(
    env: Environment, view: str, subject: str | None, environment_id: str | None, keys: set[tuple[str, ...]]
) -> list[dict[str, Any]]:
    if view == "threads":
        ctx = context(env)
        found = []
        for key in sorted(keys):
            if key[0] == "row":
                row = local_row(env, ctx, key[1])
                if row is not None:
                    found.append(row_fragment(row))
            elif key[0] == "remote-row" and key[1] in env.peers.peers:
                summary = await remote.thread_summary(remote.peer(env, key[1]), key[2])
                row = model.thread_row(summary, ctx, None, env.queries.local_title(summary))
                found.append(row_fragment(row))
            elif key[0] == "summary":
                found.append(
                    make_fragment(
                        "partials/summary.html", "env-summary", None, None, summary=env_summary(env)
                    )
                )
        return found
    if view == "thread" and subject:
        try:
            _, page = await local_page(env, subject)
        except NotFound:
            return []
        return thread_fragments(page, keys, **local_context(subject))
    if view == "remote" and subject and environment_id:
        try:
            page = await remote_page(env, environment_id, subject)
        except TetherError:
            return []
        return thread_fragments(page, None, **remote_context(environment_id, subject))
    return []


@router.get("/ui/live")
async def live(
    request: Request,
    view: str = "threads",
    thread: str | None = None,
    environment_id: Annotated[str | None, Query(alias="env")] = None,
    after: str | None = None,
) -> StreamingResponse:
    """Fragments for what changed, after every batch of events of the feed. Each message's
    SSE ``id`` is the last event it covers: a reconnect with ``?after=`` (or
    ``Last-Event-ID``) resumes there, and re-rendering is idempotent, so a replay doubles
    nothing."""
    env = guard(request)
    if view not in ("threads", "thread", "remote", "environments"):
        raise Invalid(f"unknown view {view!r}")
    if view in ("thread", "remote") and not thread:
        raise Invalid("this view needs ?thread=")
    cursor = _live_cursor(env, after, request.headers.get("last-event-id"))
    past_end = cursor > env.store.last_event_seq()
    local = env.environment_id
    links_watch = LinkWatch()

    async def stream() -> Any:
        nonlocal cursor
        yield "retry: 1000\n\n"
        if past_end:  # a cursor from another store (this one was replaced): start over
            yield _frame("reload", 0, {})
            return
        yield _frame("fragments", cursor, {"fragments": []})
        while not await request.is_disconnected():
            links = await links_watch.changed(env) if view == "environments" else []
            if links:
                yield _frame("fragments", cursor, {"fragments": links})
            batch = env.store.events_after(cursor, 500)
            if batch:
                events = [event_json(e, local) for e in batch]
                keys = model.affected(events, view, thread, local)
                version = env.store.last_event_seq()  # read before the state it labels
                fragments = await _live_fragments(env, view, thread, environment_id, keys) if keys else []
                stamp(fragments, version)
                cursor = batch[-1].seq
                yield _frame("fragments", cursor, {"fragments": fragments})
                continue
            seen = cursor
            timeout = LINK_WATCH if view == "environments" else KEEPALIVE
            woke = await env.runtime.notifier.wait_until(
                ["events"], lambda seen=seen: True if env.store.last_event_seq() > seen else None, timeout
            )
            if woke is None and view != "environments":
                yield ": keepalive\n\n"

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
