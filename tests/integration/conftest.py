"""Fixtures: real ``tether serve`` processes on loopback, one data directory each.

``server`` is a fresh environment per test; ``module_server`` is shared by the tests of one
module and ``shared_server`` by every test that only looks at threads it made itself (a
server takes ~2 s to start on 2 cores, so most tests share one); ``server_factory``
starts more than one. ``backend_server`` is one per module and process backend
(``process_backend``: SPEC §13, both backends on Linux) for the process-related tests.
Every server is stopped at the end, and the background commands it left running (they
outlive tether by design) are killed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from kit import shutdown
from tether.launch import Server

ServerFactory = Callable[..., Server]

#: The process backends (``TETHER_PROCESSES``) the process-related tests run on.
PROCESS_BACKENDS = ("linux", "portable")


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[ServerFactory]:
    servers: list[Server] = []

    def start(name: str = "env") -> Server:
        server = Server(tmp_path / name, name).start()
        servers.append(server)
        return server

    yield start
    shutdown(servers, graceful=True)


@pytest.fixture
def server(server_factory: ServerFactory) -> Server:
    return server_factory("main")


@pytest.fixture(scope="module")
def module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("env")
    server = Server(root / "module", "module").start()
    yield server
    shutdown([server], graceful=True)


@pytest.fixture(scope="module", params=PROCESS_BACKENDS)
def process_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def backend_server(tmp_path_factory: pytest.TempPathFactory, process_backend: str) -> Iterator[Server]:
    """A server of this module on ``process_backend`` (tests that only look at threads they
    made themselves share it, as they share ``shared_server``)."""
    root = tmp_path_factory.mktemp(f"env-{process_backend}")
    server = Server(root / process_backend, process_backend, env={"TETHER_PROCESSES": process_backend})
    yield server.start()
    shutdown([server], graceful=True)


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("env")
    server = Server(root / "shared", "shared").start()
    yield server
    shutdown([server], graceful=True)


@pytest.fixture
def client(server: Server) -> Iterator[httpx.Client]:
    with server.client() as found:
        yield found


@pytest.fixture(scope="module")
def module_client(module_server: Server) -> Iterator[httpx.Client]:
    with module_server.client() as found:
        yield found
