"""The PostgreSQL backend against a real server: the store contract, plus what only this
backend has (migrations under a lock, one writer across connections, the commit doorbell,
records as JSON text beside their filter columns)."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from contract import StoreContract, run, thread

from tether.domain.records import Thread
from tether.domain.types import RunStatus
from tether.store import open_store
from tether.store.base import Store
from tether.store.postgresql import PostgreSQLStore, schema
from tether.store.postgresql.store import CHANNEL, WRITE_LOCK


class TestPostgreSQLStore(StoreContract):
    """``location`` is a database URL: one fresh database per test."""

    def make_store(self, location: Any) -> Store:
        return PostgreSQLStore(str(location))

    @pytest.fixture
    def location(self, pg_url: str) -> str:
        return pg_url

    def test_open_store_picks_postgresql_for_its_urls(self, location: str) -> None:
        for url in (location, location.replace("postgresql://", "postgres://", 1)):
            store = open_store(url)
            try:
                assert isinstance(store, PostgreSQLStore)
            finally:
                store.close()

    def test_a_new_store_is_at_the_latest_schema_version(self, store: Store) -> None:
        assert store.schema_version == len(schema.MIGRATIONS)

    def test_stores_opened_together_migrate_once(self, location: str) -> None:
        """Processes starting together on a new database: the migration lock lets one migrate."""
        errors: list[BaseException] = []

        def open_close() -> None:
            try:
                PostgreSQLStore(location).close()
            except BaseException as error:
                errors.append(error)

        workers = [threading.Thread(target=open_close) for _ in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert errors == []
        with psycopg.connect(location) as conn:
            versions = conn.execute("SELECT version FROM schema_version ORDER BY version").fetchall()
        assert versions == [(n,) for n in range(1, len(schema.MIGRATIONS) + 1)]

    def test_a_write_transaction_holds_the_one_writer_lock(self, store: Store, location: str) -> None:
        """One writer at a time across processes (SQLite's single writer): while a
        transaction is open, another connection cannot take the write lock; after, it can."""
        with psycopg.connect(location, autocommit=True) as other:
            other.execute("SET lock_timeout = '200ms'")
            with store.transaction() as tx:
                tx.put(thread("thr_1"))
                with pytest.raises(psycopg.errors.LockNotAvailable):
                    other.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
            with other.transaction():
                other.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))

    def test_a_commit_rings_the_doorbell_with_what_it_wrote(self, store: Store, location: str) -> None:
        """Once per kind and commit; rolled back, or neither events nor outbox rows (a
        claim, a heartbeat): nobody is rung."""
        with psycopg.connect(location, autocommit=True) as listener:
            listener.execute(f"LISTEN {CHANNEL}")
            with pytest.raises(RuntimeError), store.transaction() as tx:
                tx.append_event("x", {})
                raise RuntimeError("rolled back")
            with store.transaction() as tx:
                tx.put(thread("thr_0"))
                tx.beat("mbr_a", 0.0, 10.0)
                tx.claim_outbox("mbr_a", 0.0, 10.0)
            assert list(listener.notifies(timeout=0.3)) == []
            with store.transaction() as tx:
                tx.append_event("x", {})
                tx.add_outbox("run.execute", {"runId": "run_1"})
                tx.append_event("y", {})
            rung = [(n.channel, n.payload) for n in listener.notifies(timeout=5, stop_after=2)]
            assert sorted(rung) == [(CHANNEL, "events"), (CHANNEL, "outbox")]
            assert list(listener.notifies(timeout=0.3)) == [], "once per commit"

    def test_records_are_kept_as_json_beside_their_filter_columns(self, store: Store, location: str) -> None:
        with store.transaction() as tx:
            tx.put(run("run_1", "thr_1", 7, RunStatus.RUNNING))
        with psycopg.connect(location) as conn:
            row = conn.execute("SELECT thread_id, status, seq FROM runs WHERE id = 'run_1'").fetchone()
        assert row == ("thr_1", "running", 7)

    def test_a_dropped_connection_is_opened_again(self, store: Store, location: str) -> None:
        with store.transaction() as tx:
            tx.put(thread("thr_1"))
        with psycopg.connect(location, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'tether' AND datname = current_database()"
            )
        with pytest.raises(psycopg.OperationalError), store.read() as reader:
            reader.count(Thread)
        with store.read() as reader:  # the next use connects again
            assert reader.count(Thread) == 1

    # ------------------------------------------------------------------ several processes

    def test_claimed_rows_are_not_handed_to_another_process_until_the_lease_ends(
        self, store: Store, location: str
    ) -> None:
        other = self.make_store(location)
        try:
            with store.transaction() as tx:
                ids = [tx.add_outbox("run.execute", {"runId": f"run_{n}"}) for n in range(3)]
                assert [r.id for r in tx.claim_outbox("mbr_a", 100.0, 10.0, limit=2)] == ids[:2]
            with other.transaction() as tx:
                assert [r.id for r in tx.claim_outbox("mbr_b", 105.0, 10.0)] == ids[2:], "a's are held"
            with other.transaction() as tx:  # a process that comes back (same member) takes its own
                assert [r.id for r in tx.claim_outbox("mbr_a", 109.0, 10.0)] == ids[:2]
            with other.transaction() as tx:  # a died: its lease (until 119) runs out
                assert [r.id for r in tx.claim_outbox("mbr_b", 118.0, 10.0)] == ids[2:]
                assert [r.id for r in tx.claim_outbox("mbr_b", 120.0, 10.0)] == ids
        finally:
            other.close()

    def test_a_failed_attempt_releases_the_claim(self, store: Store) -> None:
        with store.transaction() as tx:
            row_id = tx.add_outbox("process.start", {"itemId": "bg_1"})
            tx.claim_outbox("mbr_a", 100.0, 10.0)
            tx.fail_outbox(row_id, "boom", retry_at=101.0)
            assert tx.claim_outbox("mbr_b", 100.5, 10.0) == [], "not due yet"
            assert [r.id for r in tx.claim_outbox("mbr_b", 101.0, 10.0)] == [row_id]

    def test_a_row_for_one_process_is_claimed_by_that_process_only(self, store: Store) -> None:
        with store.transaction() as tx:
            mine = tx.add_outbox("run.stop", {"runId": "run_1", "member": "mbr_a"})
            anyone = tx.add_outbox("run.execute", {"runId": "run_2"})
            assert [r.id for r in tx.claim_outbox("mbr_b", 100.0, 10.0)] == [anyone]
            assert [r.id for r in tx.claim_outbox("mbr_a", 100.0, 10.0)] == [mine]

    def test_beats_name_the_processes_whose_lease_ran_out_until_forgotten(self, store: Store) -> None:
        with store.transaction() as tx:
            assert tx.beat("mbr_a", 100.0, 10.0) == []
            assert tx.beat("mbr_b", 105.0, 10.0) == []
            assert tx.beat("mbr_b", 111.0, 10.0) == ["mbr_a"], "a last beat at 100: gone since 110"
            assert tx.beat("mbr_c", 111.0, 10.0) == ["mbr_a"]
            kept = tx.add_outbox("run.execute", {"runId": "run_1"})
            tx.add_outbox("process.kill", {"itemId": "bg_1", "member": "mbr_a"})
            tx.forget_member("mbr_a")
            assert tx.beat("mbr_b", 112.0, 10.0) == []
            assert [r.id for r in tx.outbox()] == [kept], "rows only a could carry out went with it"

