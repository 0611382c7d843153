"""The FastAPI application of one environment."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from tether import __version__, a2a
from tether.api import errors, events, links, tasks, threads
from tether.api.auth import caller
from tether.api.limits import BodyLimit
from tether.environment import Environment
from tether.providers import usability
from tether.tools import mcp
from tether.types import Caller
from tether.web import routes as web


def create_app(env: Environment, manage_lifecycle: bool = True) -> FastAPI:
    mcp_app, mcp_sdk = mcp.build(env)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage_lifecycle:
            await env.start()
        try:
            async with mcp_sdk.lifespan():
                yield
        finally:
            if manage_lifecycle:
                await env.close()

    app = FastAPI(
        title="tether",
        version=__version__,
        description="Delegate work between agent threads and always get the answer back.",
        lifespan=lifespan,
        # Served below behind the token: every endpoint but health is closed (G10).
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.env = env
    errors.install(app)

    @app.get("/api/health", tags=["environment"])
    async def health() -> dict[str, Any]:
        return {**env.health(), "mcp": mcp_sdk.state}

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(who: Annotated[Caller, Depends(caller)]) -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False)
    async def docs(who: Annotated[Caller, Depends(caller)]) -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="tether API")

    @app.get("/api/providers", tags=["environment"], responses=errors.RESPONSES)
    async def providers(who: Annotated[Caller, Depends(caller)]) -> dict[str, Any]:
        return {"providers": usability(env.runtime.providers)}

    @app.get("/api/outbox", tags=["environment"], responses=errors.RESPONSES)
    async def outbox(who: Annotated[Caller, Depends(caller)]) -> dict[str, Any]:
        """Side effects not yet carried out, and those parked after repeated failures."""
        return env.queries.effects(who)

    @app.get("/api/stats", tags=["environment"], responses=errors.RESPONSES)
    async def stats(who: Annotated[Caller, Depends(caller)]) -> dict[str, Any]:
        """What this process did so far: transactions committed, events stored, CPU seconds
        (admin only; the benchmarks report them per task)."""
        return env.stats(who)

    app.include_router(threads.router, responses=errors.RESPONSES)
    app.include_router(tasks.router, responses=errors.RESPONSES)
    app.include_router(events.router, responses=errors.RESPONSES)
    app.include_router(links.router, responses=errors.RESPONSES)
    app.include_router(web.router, responses=errors.RESPONSES)
    # Exactly /mcp, no redirect to /mcp/ (a Mount would add one).
    app.router.routes.append(Route("/mcp", endpoint=mcp_app, methods=["GET", "POST", "DELETE"]))
    if a2a.available():  # SPEC §14; no A2A routes without the a2a extra
        from tether.a2a.serve import build_routes

        app.router.routes.extend(build_routes(env))
    app.add_middleware(BodyLimit)
    return app
