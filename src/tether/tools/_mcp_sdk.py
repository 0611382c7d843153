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
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import CallToolResult, TextContent
from pydantic import Field, ValidationError
from starlette.types import ASGIApp

from tether.environment import Environment
from tether.errors import Invalid, NotFound, TetherError
from tether.tools.mcp import DESCRIPTIONS, describe, inline_refs
from tether.tools.surface import Tools

INSTRUCTIONS = (
    "tether runs agent threads and delegates work between them. Delegated answers come back to you "
    "as completion wakes: do not poll."
)


class _Server(MCPServer):
    """The SDK's server, but a call it refuses before any tool runs — arguments that do not
    fit the tool's schema, a tool that does not exist — fails as ``{code, message}`` like
    every other failure (SPEC §5), not as the SDK's plain text, so an agent can tell a
    refusal from a result by its code."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        if self._tool_manager.get_tool(name) is None:
            return _failure(NotFound(f"there is no tool {name!r}; tools/list names them", "unknown_tool"))
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as error:
            cause = error.__cause__
            if isinstance(error, UnexpectedToolError) or not isinstance(cause, ValidationError):
                raise
            return _failure(Invalid(f"{name}: {_fields_wrong(cause)}"))


def _fields_wrong(error: ValidationError) -> str:
    """Each wrong argument by its path and what is wrong with it (never its value: that is
    the caller's data), e.g. ``taskId: Field required; mode: Input should be 'async' or 'wait'``."""
    said = [f"{'.'.join(str(part) for part in e['loc']) or 'arguments'}: {e['msg']}" for e in error.errors()]
    return "; ".join(dict.fromkeys(said))


def _failure(error: TetherError) -> CallToolResult:
    failure = error.to_dict()
    text = TextContent(type="text", text=json.dumps(failure))
    return CallToolResult(content=[text], structured_content=failure, is_error=True)


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
            return _failure(error)

    call.__name__ = name
    call.__signature__ = inspect.Signature(parameters, return_annotation=dict[str, Any])  # type: ignore[attr-defined]
    return call


def build(env: Environment) -> tuple[ASGIApp, StreamableHTTPSessionManager]:
    """The SDK's ``/mcp`` app and its session manager (whose ``run()`` the caller keeps
    open while the app serves)."""
    server = _Server(name="tether", version="1", instructions=INSTRUCTIONS)
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
