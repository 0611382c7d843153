"""Fixtures of the stress suite: real ``tether serve`` processes, one data directory each."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kit import reap_zombie_children, set_subreaper

from .stresskit import REPORT, SEED, SIZE


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


@pytest.fixture
def subreaper() -> Iterator[Any]:
    """While the test runs, this process adopts the orphans of the servers it SIGKILLs (PID 1
    of a container may not reap them), and the test can reap them: ``subreaper(keep)``."""
    set_subreaper(True)
    try:
        yield reap_zombie_children
    finally:
        set_subreaper(False)

