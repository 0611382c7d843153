"""The event feed ends when its client goes, even while it is waiting for news: the
response notices the disconnect (no poll of our own needed), and the feed's generator is
closed rather than left waiting on the notifier for a reader that is gone."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tether.api import create_app
from tether.environment import Environment


def test_the_feed_ends_when_its_client_disconnects(tmp_path: Path) -> None:
    async def main() -> None:
        env = Environment(tmp_path / "env", "feed")
        app = create_app(env, manage_lifecycle=False)
        sent: list[dict[str, Any]] = []
        first_body = asyncio.Event()
        gone = asyncio.Event()

        async def receive() -> dict[str, Any]:
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message["type"] == "http.response.body":
                first_body.set()

        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": "GET", "scheme": "http", "path": "/api/events", "raw_path": b"/api/events",
            "query_string": b"after=now&keepalive=60", "root_path": "", "server": ("t", 80),
            "client": ("c", 1), "headers": [(b"authorization", f"Bearer {env.admin_token}".encode())],
        }
        try:
            serving = asyncio.create_task(app(scope, receive, send))
            await asyncio.wait_for(first_body.wait(), 10)  # streaming, now waiting for news
            assert sent[0]["status"] == 200
            gone.set()
            await asyncio.wait_for(serving, 10)  # ended: not waiting out its 60 s keepalive
        finally:
            env.store.close()

    asyncio.run(main())
