"""The provider port (``tether.engine.port``) as the environment lends it: what a turn may
reach — and that it is the environment's own parts, not copies."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tether.environment import Environment
from tether.types import ADMIN, Caller


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Environment]:
    env = Environment(tmp_path / "env", "port")
    try:
        yield env
    finally:
        env.store.close()


def test_turns_are_lent_the_environments_own_parts(env: Environment) -> None:
    services = env.services
    assert services.commands is env.commands and services.tools is env.tools
    assert services.tools.peers is env.peers, "the tools reach the links without a late fill-in"
    assert services.shell is env.runtime.processes.backend
    assert services.workspace == env.runtime.workspace


def test_a_provider_directory_is_made_under_the_data_directory(env: Environment) -> None:
    directory = env.services.provider_dir("claude")
    assert directory == env.data_dir / "providers" / "claude" and directory.is_dir()


def test_a_thread_credential_needs_the_url_and_acts_as_its_thread(env: Environment) -> None:
    thread_id = env.commands.create_thread(ADMIN, "script")["threadId"]
    assert env.thread_credential(thread_id, "before serve", 60) is None
    env.base_url = "http://127.0.0.1:9"
    minted = env.thread_credential(thread_id, "claude session", 60)
    assert minted is not None
    url, token = minted
    assert url == "http://127.0.0.1:9/mcp"
    assert env.tokens.authenticate(token) == Caller("thread", thread_id=thread_id)
