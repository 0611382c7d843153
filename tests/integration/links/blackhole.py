"""A TCP proxy on 127.0.0.1 that can blackhole: while black it passes no bytes in either
direction, keeps every connection open and accepts new ones without forwarding them —
a partition as the two ends see it. Healed, everything held flows again."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any


class BlackholeProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="blackhole proxy", daemon=True)
        self._open = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> BlackholeProxy:
        self._thread.start()
        self._run(self._start())
        return self

    def black(self) -> None:
        self._run(self._set(False))

    def heal(self) -> None:
        self._run(self._set(True))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._run(self._close(), timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)

    # ------------------------------------------------------------------ inside the loop

    def _run(self, coroutine: Any, timeout: float = 10) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    async def _start(self) -> None:
        self._open.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _set(self, passing: bool) -> None:
        if passing:
            self._open.set()
        else:
            self._open.clear()

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self._writers.add(client_writer)
        try:
            await self._open.wait()  # accepted, but not forwarded while black
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection(*self.upstream)
            except OSError:
                return
            self._writers.add(upstream_writer)
            try:
                await asyncio.gather(self._pump(client_reader, upstream_writer),
                                     self._pump(upstream_reader, client_writer))
            finally:
                self._writers.discard(upstream_writer)
                upstream_writer.close()
        finally:
            self._writers.discard(client_writer)
            client_writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await self._open.wait()
                data = await reader.read(65536)
                await self._open.wait()  # read just before the blackhole: held until it heals
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.write_eof()
