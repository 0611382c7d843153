"""A2A, the Agent2Agent protocol (SPEC §14): every environment serves as an A2A agent.

The wire (types, JSON-RPC and HTTP+JSON bindings) is the official ``a2a-sdk``, an optional
extra (``pip install 'tether[a2a]'``). Without it the server starts as usual and simply
serves no A2A routes.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

    from tether.environment import Environment


def available() -> bool:
    """Whether the optional ``a2a-sdk`` (with its HTTP server parts) is installed."""
    return find_spec("a2a") is not None and find_spec("sse_starlette") is not None


def routes(env: Environment) -> list[BaseRoute]:
    """The agent card, ``/a2a`` (JSON-RPC) and ``/a2a/v1`` (HTTP+JSON); none without the SDK."""
    if not available():
        return []
    from tether.a2a.serve import build_routes

    return build_routes(env)
