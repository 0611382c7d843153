"""Real ``tether serve`` processes for tests, and their teardown."""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kit.processes import kill_group, leftover_wrappers
from tether.launch import Server, free_port


class LoggedServer(Server):
    """A server whose failure to start says why (its log's tail), and which picks another
    port if another process took the one it was given before its first start."""

    started = False

    def start(self, timeout: float = 60.0) -> LoggedServer:
        for attempt in range(3):
            mark = self.log.stat().st_size if self.log.exists() else 0
            try:
                super().start(timeout)
            except RuntimeError as error:
                tail = self.log_tail(mark)
                if not self.started and "address already in use" in tail.lower() and attempt < 2:
                    self.port = free_port()
                    continue
                raise RuntimeError(f"{error}\n--- {self.name}.log ---\n{tail[-3000:]}") from None
            self.started = True
            return self
        raise AssertionError("unreachable")

    def log_tail(self, mark: int = 0) -> str:
        if not self.log.exists():
            return ""
        with open(self.log, "rb") as log:
            log.seek(mark)
            return log.read().decode("utf-8", "replace")

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def get(self, path: str, **params: Any) -> Any:
        with self.client() as client:
            response = client.get(path, params=params or None)
        assert response.status_code == 200, (self.name, path, response.status_code, response.text[:500])
        return response.json()


class Servers:
    """Makes servers under one directory and tears all of them down at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.made: list[Server] = []

    def __call__(self, name: str, env: dict[str, str] | None = None) -> LoggedServer:
        server = LoggedServer(self.root / name, name, env=env)
        self.made.append(server)
        return server

    def close(self) -> None:
        shutdown(self.made)


def start_all(servers: Iterable[Server], timeout: float = 60.0) -> None:
    """Start several servers at once (each start takes a second or two on 2 cores)."""
    servers = list(servers)
    with ThreadPoolExecutor(max(1, len(servers))) as pool:
        for future in [pool.submit(s.start, timeout) for s in servers]:
            future.result()


def shutdown(servers: Iterable[Server], graceful: bool = False) -> None:
    """Stop the servers (SIGKILL, or a clean stop when ``graceful``) and kill the background
    commands they left: those outlive tether by design, but not a test."""
    servers = list(servers)
    for server in servers:
        server.stop() if graceful else server.kill()
    for server in servers:
        for pid in leftover_wrappers(server.data):
            kill_group(pid)
