"""Fixtures every test directory can use: ``servers`` / ``module_servers`` (a factory of
real ``tether serve`` processes, all torn down at the end, with what they left running)
and a throwaway PostgreSQL cluster (SPEC §12).

``pg_cluster`` is one cluster per test session (``initdb`` + ``pg_ctl`` on a free loopback
port, removed at the end); ``pg_url`` is a fresh database in it per test. Both skip, saying
why, only when PostgreSQL or psycopg is not installed — ``.ci/run`` installs both.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kit import Servers


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    made = Servers(tmp_path)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(scope="module")
def module_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    made = Servers(tmp_path_factory.mktemp("servers"))
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Any]:
    try:
        from tether.store.postgresql.local import LocalCluster, find_bindir
    except ImportError as missing:
        pytest.skip(f"PostgreSQL tests need psycopg (pip install 'tether[postgresql]'): {missing}")
    bindir = find_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (no initdb/pg_ctl: apt-get install postgresql)")
    cluster = LocalCluster(bindir)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture
def pg_url(pg_cluster: Any) -> str:
    """A new, empty database of the session's cluster."""
    return str(pg_cluster.database())
