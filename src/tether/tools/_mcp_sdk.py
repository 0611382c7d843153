"""The part of the MCP surface that needs the official ``mcp`` SDK: the tools, generated
from :class:`~tether.tools.surface.Tools`, and the SDK's streamable-HTTP app.

Kept apart from :mod:`tether.tools.mcp` because importing the SDK takes about a second:
the server loads this module off its start-up path (see ``tools.mcp.Endpoint``).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import CallToolResult, TextContent
from pydantic import Field
from starlette.types import ASGIApp

from tether.environment import Environment
from tether.errors import TetherError
from tether.tools.mcp import DESCRIPTIONS, describe, inline_refs
from tether.tools.surface import Tools

INSTRUCTIONS = (
    "tether runs agent threads and delegates work between them. Delegated answers come back to you "
    "as completion wakes: do not poll."
)


def _tool(tools: Tools, name: str, authenticate: Callable[[str | None], Any]) -> Callable[..., Any]:
    """An MCP tool function with the signature of ``Tools.<name>`` minus the caller."""
    method = getattr(tools, name)
    signature = inspect.signature(method, eval_str=True)
    parameters = [
        p.replace(annotation=Annotated[p.annotation, Field(description=describe(name, p.name))])
        for p in signature.parameters.values()
        if p.name != "caller"
    ]
    parameters.append(inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context))

    async def call(ctx: Context, **arguments: Any) -> dict[str, Any] | CallToolResult:
        headers = ctx.headers or {}
        scheme, _, token = (headers.get("authorization") or "").partition(" ")
        try:
            caller = authenticate(token.strip() if scheme.lower() == "bearer" else None)
            return await method(caller, **arguments)
        except TetherError as error:
            failure = error.to_dict()
            return CallToolResult(  # type: ignore[return-value]
                content=[TextContent(type="text", text=json.dumps(failure))],
                structured_content=failure,
                is_error=True,
            )

    call.__name__ = name
    call.__signature__ = inspect.Signature(parameters, return_annotation=dict[str, Any])  # type: ignore[attr-defined]
    return call


def build(env: Environment) -> tuple[ASGIApp, StreamableHTTPSessionManager]:
    """The SDK's ``/mcp`` app and its session manager (whose ``run()`` the caller keeps
    open while the app serves)."""
    server = MCPServer(name="tether", version="1", instructions=INSTRUCTIONS)
    for name, description in DESCRIPTIONS.items():
        server.add_tool(_tool(env.tools, name, env.tokens.authenticate), name=name, description=description)
        tool = server._tool_manager.get_tool(name)
        tool.parameters = inline_refs(tool.parameters)
    app = server.streamable_http_app(
        streamable_http_path="/mcp",
        # Sessions carry no identity (each request's bearer token does); an idle one is
        # dropped after 10 minutes rather than the SDK's 30, to bound the session table.
        session_idle_timeout=600,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    # The app's own lifespan runs only when it is mounted as root: the caller runs this.
    return app, server._lowlevel_server._session_manager
