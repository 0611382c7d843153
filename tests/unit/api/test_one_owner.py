"""The store has one owner, the event loop's thread (issue #9). FastAPI runs a plain
``def`` endpoint or dependency in its thread pool, where the store refuses to be used; so
every route and every dependency of the app must be ``async def`` — checked here for all
of them, so that a new ``def`` slip fails this test rather than a request in production."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from tether.api import create_app
from tether.environment import Environment


def _api_routes(routes: list[Any]) -> Iterator[APIRoute]:
    """Every APIRoute, also those of included routers (kept apart by newer FastAPI)."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        elif hasattr(route, "original_router"):
            yield from _api_routes(route.original_router.routes)


def _calls(dependant: Dependant) -> Iterator[tuple[str, object]]:
    if dependant.call is not None:
        yield getattr(dependant.call, "__qualname__", repr(dependant.call)), dependant.call
    for sub in dependant.dependencies:
        yield from _calls(sub)


def test_every_endpoint_and_dependency_runs_on_the_loop(tmp_path: Path) -> None:
    env = Environment(tmp_path / "env", "owner")
    try:
        app = create_app(env, manage_lifecycle=False)
        routes = list(_api_routes(app.routes))
        assert len(routes) > 20, "the app's routes were found"
        in_a_thread_pool = sorted(
            {f"{' '.join(sorted(route.methods))} {route.path}: {name}"
             for route in routes for name, call in _calls(route.dependant)
             if not inspect.iscoroutinefunction(call)}
        )
        assert in_a_thread_pool == [], in_a_thread_pool
    finally:
        env.store.close()
