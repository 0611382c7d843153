"""Fixtures for the linked-environment tests: real ``tether serve`` processes on loopback."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tether.launch import Server, free_port


class LoggedServer(Server):
    """A server whose failure to start says why (its log's tail), and which picks another
    port if another process took the one it was given before its first start."""

    started = False

    def start(self, timeout: float = 30.0) -> LoggedServer:
        for attempt in range(3):
            mark = self.log.stat().st_size if self.log.exists() else 0
            try:
                super().start(timeout)
            except RuntimeError as error:
                with open(self.log, "rb") as log:
                    log.seek(mark)
                    tail = log.read().decode("utf-8", "replace")
                if not self.started and "address already in use" in tail.lower() and attempt < 2:
                    self.port = free_port()
                    continue
                raise RuntimeError(f"{error}\n--- {self.name}.log ---\n{tail[-3000:]}") from None
            self.started = True
            return self
        raise AssertionError("unreachable")


class Servers:
    """Makes servers under one directory and tears all of them down (and whatever
    background processes they left running) at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.made: list[Server] = []

    def __call__(self, name: str, env: dict[str, str] | None = None) -> Server:
        server = LoggedServer(self.root / name, name, env=env)
        self.made.append(server)
        return server

    def close(self) -> None:
        for server in self.made:
            server.kill()
        for server in self.made:
            for pid_file in (server.data / "proc").glob("*/pid"):
                with contextlib.suppress(ValueError, OSError):
                    os.killpg(int(pid_file.read_text()), signal.SIGKILL)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    made = Servers(tmp_path)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(scope="module")
def module_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    made = Servers(tmp_path_factory.mktemp("links"))
    try:
        yield made
    finally:
        made.close()
