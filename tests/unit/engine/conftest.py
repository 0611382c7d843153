from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tether_world import World


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path / "tether.db")
    yield w
    assert w.violations == [], "a commit exposed a state that breaks G2"
    w.close()
