"""A2A, the Agent2Agent protocol (SPEC §14): every environment serves as an A2A agent.

The wire (types, JSON-RPC and HTTP+JSON bindings) is the official ``a2a-sdk``, an optional
extra (``pip install 'tether[a2a]'``). Without it the server starts as usual and simply
serves no A2A routes (``tether.api.app`` asks :func:`available` before it builds them).
"""

from __future__ import annotations

from importlib.util import find_spec


def available() -> bool:
    """Whether the optional ``a2a-sdk`` (with its HTTP server parts) is installed."""
    return find_spec("a2a") is not None and find_spec("sse_starlette") is not None
