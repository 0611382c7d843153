"""Fixtures of the browser tests: two linked ``tether serve`` processes (alpha links to
beta) shared by every test of this folder, Debian's headless Chromium, and a page signed in
to alpha. Every server is stopped at the end, with the background commands it left."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from webkit import CHROMIUM, CHROMIUM_ARGS, WAIT_MS, chromium_or_skip, link, sign_in

from tether.launch import Server


def start_pair(root: Path) -> dict[str, Server]:
    alpha, beta = Server(root / "alpha", "alpha"), Server(root / "beta", "beta")
    with ThreadPoolExecutor(2) as pool:
        # a slow start on a busy machine is not what these tests check
        for future in [pool.submit(alpha.start, 90.0), pool.submit(beta.start, 90.0)]:
            future.result()
    link(alpha, beta)
    return {"alpha": alpha, "beta": beta}


def stop_all(servers: list[Server]) -> None:
    for server in servers:
        server.stop()
    for server in servers:
        for pid_file in (server.data / "proc").glob("*/pid"):
            with contextlib.suppress(OSError, ValueError):
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)


@pytest.fixture(scope="session")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    servers = start_pair(tmp_path_factory.mktemp("web"))
    try:
        yield servers
    finally:
        stop_all(list(servers.values()))


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


def open_page(browser: Any, server: Server, width: int = 1200, height: int = 860) -> tuple[Any, list[str]]:
    """A new browser context signed in to ``server``, and the script errors it collects."""
    context = browser.new_context(viewport={"width": width, "height": height})
    context.set_default_timeout(WAIT_MS)
    found = context.new_page()
    errors: list[str] = []
    found.on("pageerror", lambda error: errors.append(str(error)))
    sign_in(found, server)
    return found, errors


@pytest.fixture
def page(browser: Any, pair: dict[str, Server]) -> Iterator[Any]:
    found, errors = open_page(browser, pair["alpha"])
    yield found
    found.context.close()
    assert errors == [], errors
