"""Serving A2A (SPEC §14) over tether's own store.

The ``a2a-sdk`` carries the wire: its JSON-RPC and HTTP+JSON dispatchers parse requests,
answer with A2A error codes and serialise answers. What they call is
:class:`~tether.a2a.handler.TetherHandler` (translations in :mod:`tether.a2a.convert`), a
``RequestHandler`` with no task store or queue of its own: every A2A task *is* a tether
task (same id), read from the store through ``Commands.view`` and changed only by engine
commands. So GetTask and ListTasks answer the same after a restart, and the late answer —
the child's later reply after its task completed — is the follow-up tether already keeps,
shown as a new A2A task in the same context that references the original.

This module builds the card route and the two bindings' routes, with bearer auth and the
fence. Everything here runs on the event loop's thread (the store's one owner): the handler's
methods are coroutines the SDK awaits directly.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import DefaultServerCallContextBuilder, create_jsonrpc_routes, create_rest_routes
from a2a.utils.constants import (
    AGENT_CARD_WELL_KNOWN_PATH,
)
from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from tether.a2a.convert import JSONRPC_PATH, REST_PREFIX, agent_card
from tether.a2a.handler import TetherHandler
from tether.api.auth import bearer
from tether.environment import Environment
from tether.errors import Forbidden, TetherError

# ---------------------------------------------------------------------------- the card, routes


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
