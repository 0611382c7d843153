"""Bearer tokens (G10): admin, link tokens, per-thread credentials."""

from __future__ import annotations

from fastapi import Request

from tether.environment import Environment
from tether.types import Caller


def environment(request: Request) -> Environment:
    return request.app.state.env


def bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.cookies.get("tether_token")


def caller(request: Request) -> Caller:
    return environment(request).authenticate(bearer(request))
