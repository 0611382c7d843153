"""Three ``tether serve`` processes on one PostgreSQL database (SPEC §12): the probe matrix
with each parent made through one process, awaited through a second and read again through
the third. The probe checks are ``test_probes``' own, collected here with this module's
``probes``.

Which process runs a turn is whichever claims its outbox row first (a race between the
process that committed it and the others' doorbells), so where the parent's turn, the
child's answer and the parent's wake run is not chosen by the test: it is read from the
store, every run must have been carried out by one of the three, and the matrix as a whole
must have used more than one — the placement of each probe is printed (``-s``).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from kit import shutdown
from tether.launch import Server

from .helpers import tasks_of, thread
from .test_postgresql_processes import member, processes, run_members
from .test_probes import (  # noqa: F401  (collected here: the same checks, three processes)
    drive,
    test_final_delivered_exactly_once,
    test_interim_and_progress_are_never_answers,
    test_probe_children_are_the_spec_scripts,
    test_progress_runs_land_in_progress_only,
)


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory, pg_cluster: Any) -> Iterator[list[Server]]:
    servers = processes(tmp_path_factory.mktemp("trio"), pg_cluster.database(), "a", "b", "c")
    yield servers
    shutdown(servers, graceful=True)


@pytest.fixture(scope="module")
def probes(trio: list[Server]) -> dict[int, dict[str, Any]]:
    """The six probes at once; probe ``p`` made through process ``p mod 3``, awaited and read
    through the next one."""
    with ThreadPoolExecutor(6) as pool:
        futures = {
            probe: pool.submit(drive, trio[probe % 3], probe, trio[(probe + 1) % 3]) for probe in range(1, 7)
        }
        return {probe: future.result() for probe, future in futures.items()}


def placement(trio: list[Server], record: dict[str, Any]) -> dict[str, list[str | None]]:
    """Which process ran each run: ``{"parent": [...], "child": [...]}`` in run order."""
    url = trio[0].env["TETHER_STORE"]
    names = {member(s): s.name for s in trio}
    found = {}
    for role in ("parent", "child"):
        view = record[role]
        members = run_members(url, view["threadId"])
        found[role] = [names.get(members[run["runId"]] or "") for run in view["runs"]]
    return found


def test_the_third_process_shows_the_same_outcome(
    trio: list[Server], probes: dict[int, dict[str, Any]]
) -> None:
    """Read once more through the process that neither made nor awaited the probe."""
    for probe, record in probes.items():
        with trio[(probe + 2) % 3].client() as client:
            parent = thread(client, record["parent"]["threadId"])
            assert parent["runs"] == record["parent"]["runs"]
            assert parent["messages"] == record["parent"]["messages"]
            assert tasks_of(client, parent["threadId"]) == record["tasks"]


def test_every_run_ran_on_one_of_the_three(trio: list[Server], probes: dict[int, dict[str, Any]]) -> None:
    used: set[str | None] = set()
    for probe, record in probes.items():
        where = placement(trio, record)
        print(f"probe {probe}: parent runs on {where['parent']}, child runs on {where['child']}")
        for role, names in where.items():
            assert None not in names, f"probe {probe}: a {role} run no process claimed: {names}"
            used.update(names)
    assert len(used) > 1, f"six probes and all their runs on one process ({used}): nothing was spread"
