"""The probe matrix of SPEC §8 on a PostgreSQL store (SPEC §12): the same six probes and
checks as ``test_probes``, against ``tether serve --store postgresql://…`` on a throwaway
cluster. The test functions are ``test_probes``' own, collected here with this module's
``backend_server``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from kit import shutdown
from tether.launch import Server

from .test_probes import (  # noqa: F401  (collected here: the same checks on PostgreSQL)
    probes,
    test_final_delivered_exactly_once,
    test_interim_and_progress_are_never_answers,
    test_monitor_lines_fold_into_its_finished_run,
    test_probe_children_are_the_spec_scripts,
    test_progress_runs_land_in_progress_only,
)


@pytest.fixture(scope="module")
def backend_server(tmp_path_factory: pytest.TempPathFactory, pg_cluster: Any) -> Iterator[Server]:
    """One ``tether serve`` whose environment lives in a fresh PostgreSQL database."""
    root = tmp_path_factory.mktemp("env-pg")
    server = Server(root / "pg", "pg", env={"TETHER_STORE": pg_cluster.database()})
    yield server.start()
    shutdown([server], graceful=True)


def test_the_environment_lives_in_the_database(backend_server: Server, pg_cluster: Any) -> None:
    assert not (backend_server.data / "tether.db").exists(), "no SQLite file beside it"
    with backend_server.client() as client:
        environment_id = client.get("/api/health").json()["environmentId"]
    with psycopg.connect(backend_server.env["TETHER_STORE"]) as conn:
        row = conn.execute("SELECT value FROM meta WHERE key = 'environment_id'").fetchone()
        token = conn.execute("SELECT value FROM meta WHERE key = 'admin_token'").fetchone()
    assert row == (environment_id,)
    assert token == (backend_server.token,), "the admin token is the environment's, kept in it"
