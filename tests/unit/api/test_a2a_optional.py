"""``a2a-sdk`` is an optional extra: without it the app builds and serves no A2A routes."""

from __future__ import annotations

from pathlib import Path

import pytest

import tether.a2a
from tether.api import create_app
from tether.environment import Environment

A2A_PATHS = {"/.well-known/agent-card.json", "/a2a", "/a2a/v1/message:send"}


def _paths(env: Environment) -> set[str]:
    return {getattr(route, "path", "") for route in create_app(env, manage_lifecycle=False).routes}


@pytest.mark.parametrize("installed", [True, False])
def test_a2a_routes_only_with_the_sdk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, installed: bool
) -> None:
    if not installed:
        monkeypatch.setattr(tether.a2a, "find_spec", lambda name: None)
    env = Environment(tmp_path / "env", "optional")
    try:
        paths = _paths(env)
        assert (paths >= A2A_PATHS) if installed else not (A2A_PATHS & paths)
        assert "/api/health" in paths
    finally:
        env.store.close()
