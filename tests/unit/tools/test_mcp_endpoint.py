"""The MCP SDK loads off the start-up path (``tools.mcp._Sdk``): the server answers before
the SDK is in, a request to ``/mcp`` that comes first waits for it, and a load that fails
is answered 503 with the reason while the rest of the server goes on."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from tether.api import create_app
from tether.environment import Environment
from tether.tools import mcp

INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "t", "version": "1"}},
}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def serve(tmp_path: Path, check: Callable[[Environment, httpx.AsyncClient], object]) -> None:
    """Run ``check`` against the app with its lifespan running, on one loop."""

    async def main() -> None:
        env = Environment(tmp_path / "env", "lazy")
        app = create_app(env, manage_lifecycle=False)
        try:
            async with app.router.lifespan_context(app):
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                    await check(env, client)  # type: ignore[misc]
        finally:
            env.store.close()

    asyncio.run(main())


def held_import(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Make the SDK's import wait for ``release``; ``entered`` is set once it waits."""
    entered, release = threading.Event(), threading.Event()

    real = mcp._import_sdk

    def import_sdk() -> ModuleType:
        entered.set()
        release.wait(30)
        return real()

    monkeypatch.setattr(mcp, "_import_sdk", import_sdk)
    return entered, release


def test_a_request_before_the_sdk_is_in_waits_for_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entered, release = held_import(monkeypatch)

    async def check(env: Environment, client: httpx.AsyncClient) -> None:
        auth = {**HEADERS, "Authorization": f"Bearer {env.admin_token}"}
        await asyncio.to_thread(entered.wait, 30)
        assert (await client.get("/api/health")).json()["mcp"] == "loading"  # up without the SDK
        refused = await client.post("/mcp", json=INITIALIZE, headers={**HEADERS, "Authorization": "Bearer x"})
        assert refused.status_code == 401  # a bad token needs no SDK to be refused
        pending = asyncio.create_task(client.post("/mcp", json=INITIALIZE, headers=auth))
        await asyncio.sleep(0)  # let the request reach the guard
        assert not pending.done()  # it cannot be answered without the SDK
        release.set()
        answered = await pending
        assert answered.status_code == 200, answered.text
        assert "mcp-session-id" in answered.headers
        assert (await client.get("/api/health")).json()["mcp"] == "ready"

    serve(tmp_path, check)


def test_a_failed_load_is_answered_503_and_the_server_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def import_sdk() -> ModuleType:
        raise ImportError("no module named mcp (a broken install)")

    monkeypatch.setattr(mcp, "_import_sdk", import_sdk)

    async def check(env: Environment, client: httpx.AsyncClient) -> None:
        auth = {**HEADERS, "Authorization": f"Bearer {env.admin_token}"}
        for _ in range(2):  # every request is told, not only the first
            failed = await client.post("/mcp", json=INITIALIZE, headers=auth)
            assert failed.status_code == 503
            assert failed.json()["error"]["code"] == "mcp_unavailable"
            assert "a broken install" in failed.json()["error"]["message"]
        assert (await client.get("/api/health")).json()["mcp"] == "failed"

    serve(tmp_path, check)
    assert "the MCP endpoint failed" in caplog.text
