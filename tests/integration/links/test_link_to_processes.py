"""A link to an environment served by two processes on one PostgreSQL database (SPEC §12):
the origin's link points at one of them, the remote children's work is claimed by either,
and the feed the origin follows shows what both commit — every answer arrives once."""

from __future__ import annotations

from typing import Any

from linkkit import EXPECTED_AS, run_probes

from kit import Servers, link


def test_a_link_to_a_two_process_environment_delivers_every_answer_once(
    servers: Servers, pg_cluster: Any
) -> None:
    env = {"TETHER_STORE": pg_cluster.database(), "TETHER_LEASE_SECONDS": "2"}
    origin, a, b = servers("origin"), servers("a", env), servers("b", env)
    for server in (origin, a, b):
        server.start()
    link(origin, a)
    results = run_probes([(origin, a, probe, "remote") for probe in (1, 2, 3, 5)])
    for result in results:
        row: dict[str, Any] = result["outcome"]
        assert row["delivered"] and row["finalCount"] == 1, row
        assert row["deliveredAs"] == EXPECTED_AS[row["probe"]], row
