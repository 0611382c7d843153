"""Run one environment: the engine and the HTTP server in one asyncio loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path

import uvicorn

from tether.api import create_app
from tether.environment import Environment


def _configure_logging() -> None:
    """Plain lines on stderr, set before anything else does: the ``mcp`` SDK would install
    a rich console handler, and httpx logs every request at INFO — on a busy link that was
    a twentieth of the server's time, spent formatting lines nobody reads."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)


async def serve(
    data: Path, port: int, host: str = "127.0.0.1", name: str | None = None, store: str | None = None
) -> None:
    _configure_logging()
    env = Environment(data, name, store=store)  # writes admin.token before we listen
    env.base_url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{port}"
    app = create_app(env)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=2,
        # Longer than clients keep idle connections (Node's fetch: 4 s), so that the client
        # closes first: with uvicorn's 5 s, a loaded Claude Code CLI reused a connection
        # the server was closing, and its MCP tool call failed with ECONNRESET.
        timeout_keep_alive=75,
    )
    server = uvicorn.Server(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # Windows has no loop signal handlers; uvicorn's own Ctrl-C handling serves there.
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    logging.getLogger("tether").info(
        "tether %s (%s) on http://%s:%d", env.name, env.environment_id, host, port
    )
    await server.serve()
