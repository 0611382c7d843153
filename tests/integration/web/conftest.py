"""Fixtures of the browser tests: two linked ``tether serve`` processes (alpha links to
beta) shared by every test of this folder, Debian's headless Chromium, and a page signed in
to alpha. Every server is stopped at the end, with the background commands it left."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from webkit import CHROMIUM, CHROMIUM_ARGS, chromium_or_skip, open_page

from kit import link, shutdown, start_all
from tether.launch import Server


def start_pair(root: Path) -> dict[str, Server]:
    alpha, beta = Server(root / "alpha", "alpha"), Server(root / "beta", "beta")
    start_all([alpha, beta], 90.0)  # a slow start on a busy machine is not what these tests check
    link(alpha, beta)
    return {"alpha": alpha, "beta": beta}


@pytest.fixture(scope="session")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    servers = start_pair(tmp_path_factory.mktemp("web"))
    try:
        yield servers
    finally:
        shutdown(list(servers.values()), graceful=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Per module, not per session: Playwright's sync API keeps an event loop running in
    this thread while it is open, and every asyncio test after it would then fail."""
    chromium_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        found = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield found
        finally:
            found.close()


@pytest.fixture
def page(browser: Any, pair: dict[str, Server]) -> Iterator[Any]:
    found, errors = open_page(browser, pair["alpha"])
    yield found
    found.context.close()
    assert errors == [], errors
