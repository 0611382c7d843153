"""Fixtures of the stress suite: real ``tether serve`` processes, one data directory each."""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .kit import REPORT, SEED, SIZE, StressServer, shutdown

_PR_SET_CHILD_SUBREAPER = 36


def pytest_collection_modifyitems(config: Any, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.stress)


def pytest_report_header(config: Any) -> str:
    return f"tether stress: size={SIZE} seed={SEED} (replay with TETHER_STRESS_SEED={SEED})"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not REPORT:
        return
    terminalreporter.section(f"tether stress ({SIZE}, seed {SEED})")
    for line in REPORT:
        terminalreporter.write_line(line)


class Servers:
    """Makes servers under one root and, at the end, kills them and what they left."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.made: list[StressServer] = []

    def __call__(self, name: str, env: dict[str, str] | None = None) -> StressServer:
        server = StressServer(self.root / name, name, env=env)
        self.made.append(server)
        return server

    def close(self) -> None:
        shutdown(self.made)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    made = Servers(tmp_path)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(scope="module")
def module_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    made = Servers(tmp_path_factory.mktemp("stress"))
    try:
        yield made
    finally:
        made.close()


def _subreaper(on: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def reap_orphans(keep: set[int]) -> None:
    """Reap ended children of ours (the adopted orphans of killed servers), but not ``keep``."""
    me = str(os.getpid())
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
            pid = int(stat_file.parent.name)
            if fields[1] == me and fields[0] == "Z" and pid not in keep:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)


@pytest.fixture
def subreaper() -> Iterator[Any]:
    """While the test runs, this process adopts the orphans of the servers it SIGKILLs (PID 1
    of a container may not reap them), and the test can reap them: ``subreaper(keep)``."""
    _subreaper(True)
    try:
        yield reap_orphans
    finally:
        _subreaper(False)

