"""Start ``tether serve`` processes on loopback — for the demo, the tests and benchmarks.

They are real servers in real processes: the same command a user runs.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """One ``tether serve`` process. ``kill()`` is SIGKILL (TerminateProcess on Windows);
    ``start()`` again reuses the data. ``env`` adds environment variables (e.g.
    ``TETHER_PROCESSES``) to the server's."""

    def __init__(
        self, data: Path, name: str, port: int | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.data = data
        self.env = dict(env or {})
        self.name = name
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log = data.parent / f"{name}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token(self) -> str:
        return (self.data / "admin.token").read_text().strip()

    def start(self, timeout: float = 60.0) -> Server:
        self.data.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tether",
                    "serve",
                    "--data",
                    str(self.data),
                    "--port",
                    str(self.port),
                    "--name",
                    self.name,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tether serve exited: see {self.log}")
            try:
                if httpx.get(f"{self.url}/api/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.05)  # the process is still starting: nothing to await yet
        self.kill()  # not left running behind a failed start
        raise RuntimeError(f"tether serve did not answer within {timeout}s: see {self.log}")

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def client(self, timeout: float = 60.0) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=timeout
        )


def follow_events(url: str, token: str, check: Callable[[], Any], timeout: float, after: str = "now") -> Any:
    """Re-evaluate ``check`` after every event of the feed until it returns a truthy value.

    Event-driven waiting for clients: no fixed sleeps, and nothing missed between the first
    check and the subscription, since the stream is opened before the first check.
    """
    deadline = time.monotonic() + timeout
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with httpx.stream(
            "GET",
            f"{url}/api/events",
            params={"after": after},
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=5.0),
        ) as response:
            result = check()
            if result:
                return result
            for line in _lines(response.iter_lines(), deadline):
                if line.startswith("data:") or line.startswith(":"):
                    result = check()
                    if result:
                        return result
    except httpx.ReadTimeout:
        pass
    return check()


def _lines(lines: Iterator[str], deadline: float) -> Iterator[str]:
    for line in lines:
        yield line
        if time.monotonic() > deadline:
            return


def event_data(line: str) -> dict[str, Any]:
    return json.loads(line.removeprefix("data:").strip())
