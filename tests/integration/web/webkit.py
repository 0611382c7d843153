"""Helpers for the web page tests: real ``tether serve`` processes, linked, and a real
headless Chromium (Debian's, driven by Playwright) signed in to them.

Waits are on DOM states (Playwright's ``expect``) or on the servers' own event feeds and
``/wait`` endpoints; nothing sleeps to synchronise.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from kit import thread
from tether.launch import Server, follow_events

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: Where screenshots of the main views go: docs/screenshots/ when TETHER_SCREENSHOTS=1
#: (to refresh the committed ones), else a scratch directory (still taken, never committed).
SCREENSHOTS = (
    Path(__file__).resolve().parents[3] / "docs" / "screenshots"
    if os.environ.get("TETHER_SCREENSHOTS") == "1"
    else Path(tempfile.gettempdir()) / "tether-screenshots"
)
TIMEOUT = 60.0
WAIT_MS = 60_000


def expect() -> Any:
    """Playwright's ``expect``, waiting up to ``WAIT_MS`` for the DOM state it checks."""
    from playwright.sync_api import expect as found

    found.set_options(timeout=WAIT_MS)
    return found


def chromium_or_skip() -> None:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[test]')")


def api(server: Server, method: str, path: str, **kwargs: Any) -> Any:
    with server.client() as client:
        response = client.request(method, path, **kwargs)
    assert response.status_code < 300, (method, path, response.status_code, response.text)
    return response.json()


def await_view(server: Server, thread_id: str, check: Any, what: str, timeout: float = TIMEOUT) -> Any:
    """Re-read the thread after every event of the server's feed until ``check(view)``."""

    def probe() -> Any:
        view = thread(server, thread_id)
        return view if check(view) else None

    found = follow_events(server.url, server.token, probe, timeout)
    assert found, f"timed out waiting for {what}"
    return found


def screenshot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / name), full_page=False)


def sign_in(page: Any, server: Server, path: str = "/") -> None:
    page.goto(server.url + path)
    page.get_by_label("Admin token").fill(server.token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(server.url + path)


def unique_ids(page: Any) -> list[str]:
    """Ids that occur more than once on the page (there must be none)."""
    return list(
        page.evaluate(
            """() => { const seen = {}, twice = [];
                for (const el of document.querySelectorAll('[id]')) {
                  if (seen[el.id]) twice.push(el.id); seen[el.id] = true; }
                return twice; }"""
        )
    )


def health(server: Server) -> dict[str, Any]:
    return dict(httpx.get(f"{server.url}/api/health", timeout=5).json())


def open_page(browser: Any, server: Server, width: int = 1200, height: int = 860) -> tuple[Any, list[str]]:
    """A new browser context signed in to ``server``, and the script errors it collects."""
    context = browser.new_context(viewport={"width": width, "height": height})
    context.set_default_timeout(WAIT_MS)
    found = context.new_page()
    errors: list[str] = []
    found.on("pageerror", lambda error: errors.append(str(error)))
    sign_in(found, server)
    return found, errors
