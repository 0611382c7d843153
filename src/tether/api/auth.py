"""Bearer tokens (G10): admin, link tokens, per-thread credentials.

The dependencies are ``async def`` on purpose: FastAPI runs a plain ``def`` dependency in
its thread pool, and the store belongs to the event loop's thread (it refuses any other).
"""

from __future__ import annotations

from fastapi import Request

from tether.environment import Environment
from tether.types import Caller


def environment(request: Request) -> Environment:
    return request.app.state.env


async def environment_dependency(request: Request) -> Environment:
    """``environment`` as a dependency (async: no thread-pool hop per request)."""
    return environment(request)


def bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.cookies.get("tether_token")


async def caller(request: Request) -> Caller:
    return environment(request).tokens.authenticate(bearer(request))
