"""The SQLite backend: the store contract, plus what only SQLite has (WAL, migrations by
``PRAGMA user_version``, records as JSON beside their filter columns, lock timeouts)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from contract import StoreContract, run, thread

from tether.domain.records import Thread
from tether.domain.types import RunStatus
from tether.store.base import Store
from tether.store.sqlite import SQLiteStore, checkpoint, schema


class TestSQLiteStore(StoreContract):
    def make_store(self, location: Path) -> Store:
        return SQLiteStore(location / "t.db")

    def test_a_new_store_is_at_the_latest_schema_version(self, store: Store) -> None:
        assert store.schema_version == len(schema.MIGRATIONS)

    def test_the_file_runs_wal(self, store: Store, location: Path) -> None:
        conn = sqlite3.connect(location / "t.db")
        try:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert conn.execute("PRAGMA user_version").fetchone()[0] == len(schema.MIGRATIONS)
        finally:
            conn.close()

    def test_migrations_apply_once_in_order_from_the_stored_version(
        self, location: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        SQLiteStore(location / "t.db").close()
        extra = "CREATE TABLE extra (id TEXT PRIMARY KEY); INSERT INTO extra VALUES ('row')"
        monkeypatch.setattr(schema, "MIGRATIONS", [*schema.MIGRATIONS, extra])
        monkeypatch.setattr("tether.store.sqlite.store.MIGRATIONS", schema.MIGRATIONS)
        for _ in range(2):  # the second open must not apply it again (it would fail on the table)
            store = SQLiteStore(location / "t.db")
            assert store.schema_version == len(schema.MIGRATIONS)
            store.close()
        conn = sqlite3.connect(location / "t.db")
        try:
            assert conn.execute("SELECT COUNT(*) FROM extra").fetchone()[0] == 1
        finally:
            conn.close()

    def test_a_failing_migration_changes_nothing(
        self, location: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        SQLiteStore(location / "t.db").close()
        broken = "CREATE TABLE half (id TEXT); THIS IS NOT SQL"
        monkeypatch.setattr("tether.store.sqlite.store.MIGRATIONS", [*schema.MIGRATIONS, broken])
        with pytest.raises(sqlite3.OperationalError):
            SQLiteStore(location / "t.db")
        conn = sqlite3.connect(location / "t.db")
        try:
            assert conn.execute("PRAGMA user_version").fetchone()[0] == len(schema.MIGRATIONS)
            names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            assert "half" not in names
        finally:
            conn.close()

    def test_a_lock_timeout_does_not_break_the_store(self, store: Store, location: Path) -> None:
        store._conn.execute("PRAGMA busy_timeout=50")  # type: ignore[attr-defined]  # fail fast
        other = sqlite3.connect(location / "t.db", isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # e.g. a CLI process holding the write lock
            with pytest.raises(sqlite3.OperationalError), store.transaction():
                pass
            other.execute("ROLLBACK")
        finally:
            other.close()
        with store.transaction() as tx:  # the lock is gone: the store must work again
            tx.put(thread("thr_1"))
        with store.transaction() as tx:
            assert tx.get(Thread, "thr_1") is not None

    def test_the_wal_is_checkpointed_by_a_thread_of_its_own_not_by_commits(
        self, store: SQLiteStore, location: Path
    ) -> None:
        """Far below SQLite's own threshold (1,000 pages), committed rows still reach the
        database file: the checkpoint thread copied them, not a COMMIT on the loop."""
        done = store._checkpointer.checkpointed
        for i in range(checkpoint.EVERY):
            with store.transaction() as tx:
                tx.append_event("test.event", {"i": i, "text": "x" * 1000})

        def in_the_file() -> int:  # immutable: the database file alone, not the WAL
            conn = sqlite3.connect(f"file:{location / 't.db'}?immutable=1", uri=True)
            try:
                return int(conn.execute("SELECT COUNT(*) FROM events").fetchone()[0])
            except sqlite3.OperationalError:  # not even the schema is in the file yet
                return 0
            finally:
                conn.close()

        while in_the_file() < checkpoint.EVERY:
            assert done.wait(10), "no checkpoint within 10 s"
            done.clear()
        assert store._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == checkpoint.BACKSTOP

    def test_records_are_kept_as_json_beside_their_filter_columns(self, store: Store, location: Path) -> None:
        with store.transaction() as tx:
            tx.put(run("run_1", "thr_1", 7, RunStatus.RUNNING))
        conn = sqlite3.connect(location / "t.db")
        try:
            row = conn.execute("SELECT thread_id, status, seq FROM runs WHERE id = 'run_1'").fetchone()
            assert row == ("thr_1", "running", 7)
        finally:
            conn.close()

    def test_unknown_json_fields_are_ignored_when_loading(self, store: Store, location: Path) -> None:
        with store.transaction() as tx:
            tx.put(thread("thr_1"))
        conn = sqlite3.connect(location / "t.db", isolation_level=None)
        try:
            conn.execute(
                "UPDATE threads SET data = json_set(data, '$.from_the_future', 1) WHERE id = 'thr_1'"
            )
        finally:
            conn.close()
        with store.transaction() as tx:
            assert tx.get(Thread, "thr_1") == thread("thr_1")
