"""The SQLite backend: stdlib ``sqlite3``, WAL, ``synchronous=NORMAL``.

One connection, owned by the thread that opened the store (the event loop's, in a
server): any use from another thread raises :class:`ForeignThread` before a statement
runs, so transactions never interleave inside this process. A command's transaction is
``BEGIN IMMEDIATE``, which takes the write lock up front and keeps a second process (a CLI
tool, say) from deadlocking against us; a read is a plain ``BEGIN`` (a WAL snapshot that
takes no write lock). Checkpoints of the WAL run on a thread of their own, which touches
no record (``checkpoint.py``). A record read by its key comes from the records as last
committed, when this connection has it (``committed.py``).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tether.codec import dumps, loads
from tether.domain.records import Record
from tether.ids import now
from tether.store.base import (
    TABLES,
    Event,
    ForeignThread,
    OutboxRow,
    R,
    Reader,
    Store,
    Table,
    Transaction,
    events_where,
)
from tether.store.sqlite.checkpoint import BACKSTOP, Checkpointer
from tether.store.sqlite.committed import Committed, Stored
from tether.store.sqlite.schema import MIGRATIONS

_OUTBOX_COLUMNS = "id, kind, payload, thread_id, attempts, last_error, parked"


def _outbox_row(row: tuple[Any, ...]) -> OutboxRow:
    return OutboxRow(row[0], row[1], loads(row[2]), row[3], row[4], row[5], bool(row[6]))


class _SQLiteReader(Reader):
    def __init__(self, conn: sqlite3.Connection, committed: Committed) -> None:
        self._conn = conn
        self._committed = committed

    def _where(self, table: Table, where: dict[str, Any]) -> tuple[str, list[Any]]:
        clauses, args = [], []
        for column, value in where.items():
            if column not in table.columns and column != table.key:
                raise ValueError(f"{table.name} cannot be filtered on {column}")
            if isinstance(value, list | set | tuple | frozenset):
                values = list(value)
                clauses.append(f"{column} IN ({','.join('?' * len(values))})" if values else "0")
                args.extend(values)
            elif value is None:
                clauses.append(f"{column} IS NULL")
            else:
                clauses.append(f"{column} = ?")
                args.append(value)
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", args

    def get(self, cls: type[R], key: str) -> R | None:
        table = TABLES[cls]
        stored = self._stored(table.name, key)
        if stored is None:
            sql = f"SELECT {', '.join(('data', *table.columns))} FROM {table.name} WHERE {table.key} = ?"
            row = self._conn.execute(sql, (key,)).fetchone()
            if row is None:
                return None
            stored = Stored(row[0], tuple(row[1:]))
            self._committed.note(table.name, key, stored)  # not this transaction's: see _stored
        return cls.from_dict(loads(stored.text))

    def _stored(self, table: str, key: str) -> Stored | None:
        return self._committed.get(table, key)

    def find_rows(self, cls: type[Record], limit: int | None = None, **where: Any) -> list[tuple[str, str]]:
        table = TABLES[cls]
        clause, args = self._where(table, where)
        sql = f"SELECT {table.key}, data FROM {table.name}{clause} ORDER BY {table.order}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return self._conn.execute(sql, args).fetchall()

    def count(self, cls: type[Record], **where: Any) -> int:
        table = TABLES[cls]
        clause, args = self._where(table, where)
        return self._conn.execute(f"SELECT COUNT(*) FROM {table.name}{clause}", args).fetchone()[0]

    def value(self, cls: type[Record], key: str, column: str) -> Any:
        table = TABLES[cls]
        if column not in table.columns:
            raise ValueError(f"{table.name} has no column {column}")
        stored = self._stored(table.name, key)
        if stored is not None:  # its columns are kept beside its JSON: no statement
            return stored.columns[table.columns.index(column)]
        sql = f"SELECT {column} FROM {table.name} WHERE {table.key} = ?"
        row = self._conn.execute(sql, (key,)).fetchone()
        return row[0] if row else None

    def get_request(self, scope: str, key: str) -> dict[str, Any] | None:
        row = self._conn.execute(
            "SELECT response FROM requests WHERE scope = ? AND key = ?", (scope, key)
        ).fetchone()
        return loads(row[0]) if row else None

    def get_meta(self, key: str) -> str | None:
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def outbox(self, limit: int = 100, due: float | None = None) -> list[OutboxRow]:
        sql, args = f"SELECT {_OUTBOX_COLUMNS} FROM outbox WHERE parked = 0", []
        if due is not None:
            sql += " AND retry_at <= ?"
            args.append(due)
        rows = self._conn.execute(sql + " ORDER BY id LIMIT ?", (*args, limit))
        return [_outbox_row(row) for row in rows]

    def parked(self, thread_id: str | None = None) -> list[OutboxRow]:
        sql, args = f"SELECT {_OUTBOX_COLUMNS} FROM outbox WHERE parked = 1", []
        if thread_id is not None:
            sql += " AND thread_id = ?"
            args.append(thread_id)
        return [_outbox_row(row) for row in self._conn.execute(sql + " ORDER BY id", args)]

    def next_retry(self) -> float | None:
        row = self._conn.execute(
            "SELECT MIN(retry_at) FROM outbox WHERE parked = 0 AND attempts > 0"
        ).fetchone()
        return row[0]


class _SQLiteTransaction(_SQLiteReader, Transaction):
    def __init__(self, conn: sqlite3.Connection, committed: Committed) -> None:
        super().__init__(conn, committed)
        #: What this transaction put, by (table, key): read back from here, and handed to
        #: the committed records once (and only if) it commits.
        self.written: dict[tuple[str, str], Stored] = {}

    def _stored(self, table: str, key: str) -> Stored | None:
        return self.written.get((table, key)) or self._committed.get(table, key)

    def put(self, record: Record) -> None:
        table = TABLES[type(record)]
        key = getattr(record, table.key)
        stored = Stored(dumps(record.to_dict()), tuple(getattr(record, name) for name in table.columns))
        before = self._stored(table.name, key)
        if before is None or not self._update(table, key, before.columns, stored):
            self._upsert(table, key, stored)
        self.written[(table.name, key)] = stored

    def _update(self, table: Table, key: str, before: tuple[Any, ...], stored: Stored) -> bool:
        """Update a row whose stored columns are known, setting only those that changed: an
        ``UPDATE`` rewrites the entry of every index on a column it sets, even to the same
        value (a task's put touched seven B-trees where its JSON alone needed one). False if
        the row was not there after all."""
        pairs = zip(table.columns, before, stored.columns, strict=True)
        changed = [(name, value) for name, old, value in pairs if old != value]
        sets = "".join(f"{name} = ?, " for name, _ in changed)
        cursor = self._conn.execute(
            f"UPDATE {table.name} SET {sets}data = ? WHERE {table.key} = ?",
            (*(value for _, value in changed), stored.text, key),
        )
        return cursor.rowcount == 1

    def _upsert(self, table: Table, key: str, stored: Stored) -> None:
        # An upsert, not INSERT OR REPLACE: a replace deletes the row and gives it a new
        # rowid, which would reorder every list ordered by creation.
        names = (table.key, *table.columns)
        updates = ", ".join(f"{name} = excluded.{name}" for name in (*table.columns, "data"))
        self._conn.execute(
            f"INSERT INTO {table.name} ({', '.join(names)}, data) "
            f"VALUES ({', '.join('?' * (len(names) + 1))}) "
            f"ON CONFLICT({table.key}) DO UPDATE SET {updates}",
            (key, *stored.columns, stored.text),
        )

    def append_event(
        self,
        type: str,
        data: dict[str, Any],
        *,
        thread_id: str | None = None,
        run_id: str | None = None,
        task_id: str | None = None,
        token_id: str | None = None,
    ) -> int:
        cursor = self._conn.execute(
            "INSERT INTO events (type, at, thread_id, run_id, task_id, token_id, data) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (type, now(), thread_id, run_id, task_id, token_id, dumps(data)),
        )
        return int(cursor.lastrowid or 0)

    def add_outbox(self, kind: str, payload: dict[str, Any], thread_id: str | None = None) -> int:
        cursor = self._conn.execute(
            "INSERT INTO outbox (kind, payload, thread_id) VALUES (?, ?, ?)",
            (kind, dumps(payload), thread_id),
        )
        return int(cursor.lastrowid or 0)

    def remove_outbox(self, row_id: int) -> None:
        self._conn.execute("DELETE FROM outbox WHERE id = ?", (row_id,))

    def fail_outbox(self, row_id: int, error: str, retry_at: float | None) -> None:
        self._conn.execute(
            "UPDATE outbox SET attempts = attempts + 1, last_error = ?, retry_at = ?, parked = ? "
            "WHERE id = ?",
            (error, retry_at or 0, int(retry_at is None), row_id),
        )

    def put_request(self, scope: str, key: str, response: dict[str, Any]) -> None:
        self._conn.execute(
            "INSERT OR REPLACE INTO requests (scope, key, response) VALUES (?, ?, ?)",
            (scope, key, dumps(response)),
        )

    def set_meta(self, key: str, value: str) -> None:
        self._conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))


def _event(row: tuple[Any, ...]) -> Event:
    return Event(*row)


class SQLiteStore(Store):
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        # sqlite3's own same-thread check stays on as a second line behind ``_own``.
        self._conn = sqlite3.connect(self.path, isolation_level=None)
        self._owner = threading.get_ident()
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute("PRAGMA busy_timeout=5000")
        self._conn.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP}")
        self._tx_depth = 0
        self._committed = Committed()
        self._migrate()
        self._checkpointer = Checkpointer(self.path)

    def _migrate(self) -> None:
        version = self._conn.execute("PRAGMA user_version").fetchone()[0]
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in script.split(";"):
                    if statement.strip():
                        self._conn.execute(statement)
                self._conn.execute(f"PRAGMA user_version = {number}")
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def _own(self) -> None:
        if threading.get_ident() != self._owner:
            raise ForeignThread(
                f"the store is owned by thread {self._owner} (the event loop's) and was used from "
                f"thread {threading.get_ident()} ({threading.current_thread().name}): store access "
                "must run on the loop (an `async def` route or dependency, never a thread pool)"
            )

    @property
    def schema_version(self) -> int:
        self._own()
        return int(self._conn.execute("PRAGMA user_version").fetchone()[0])

    @contextmanager
    def _begin(self, statement: str) -> Iterator[None]:
        self._own()
        if self._tx_depth:
            raise RuntimeError("transactions do not nest: one command, one transaction")
        self._conn.execute(statement)  # may fail (locked): then nothing is open
        self._tx_depth += 1
        try:
            self._committed.check(self._conn)
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        else:
            self._conn.execute("COMMIT")
        finally:
            self._tx_depth -= 1

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        with self._begin("BEGIN IMMEDIATE"):
            tx = _SQLiteTransaction(self._conn, self._committed)
            yield tx
        self._committed.commit(tx.written)
        self.commits += 1
        self._checkpointer.committed()

    @contextmanager
    def read(self) -> Iterator[Reader]:
        with self._begin("BEGIN"):
            yield _SQLiteReader(self._conn, self._committed)

    def events_after(
        self, seq: int, limit: int = 500, token_id: str | None = None, types: Sequence[str] = ()
    ) -> list[Event]:
        self._own()
        where, args = events_where(seq, token_id, types, "?")
        sql = f"SELECT seq, type, at, thread_id, run_id, task_id, token_id, data FROM events{where}"
        rows = self._conn.execute(sql + " ORDER BY seq LIMIT ?", (*args, limit))
        return [_event(row) for row in rows]

    def last_event_seq(self) -> int:
        self._own()
        row = self._conn.execute("SELECT MAX(seq) FROM events").fetchone()
        return int(row[0] or 0)

    def prune_events(self, before: str) -> int:
        self._own()
        cursor = self._conn.execute("DELETE FROM events WHERE at < ?", (before,))
        return cursor.rowcount

    def close(self) -> None:
        self._own()
        self._checkpointer.close()
        self._conn.close()
