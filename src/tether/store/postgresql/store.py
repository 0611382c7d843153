"""The PostgreSQL backend: psycopg 3, one synchronous connection owned by the event loop's
thread — the same one-owner rule as SQLite, with :class:`ForeignThread` for any other.

Why synchronous: commands are short synchronous functions over one transaction, and the
engine relies on no two of them interleaving within a process. A sync connection keeps
the :class:`~tether.store.base.Store` interface and that rule as they are; the cost is
that the loop waits out each round trip (about 0.1 ms on loopback), which is why several
processes, not one, are the way to scale (SPEC §12).

**Write exclusion.** Every read-write transaction starts by taking one transaction-scoped
advisory lock (:data:`WRITE_LOCK`) — SQLite's single writer, across every process on the
database. Writers therefore commit one after another, so event sequence numbers are
handed out in commit order (a reader following ``events_after`` never skips a late
commit), and a transaction at READ COMMITTED sees everything committed before it took
the lock: there are no serialization failures to retry. Per-thread locks are the step
after this one (see docs/architecture.md).

**Doorbell.** A write transaction that appends events or adds outbox rows sends ``NOTIFY``
on :data:`CHANNEL` (payload ``events`` / ``outbox``), delivered only if it commits; other
processes listening there (:meth:`PostgreSQLStore.rings`) read the events after the last
they saw, or look at the outbox (the store is the truth). Claims and heartbeats write
neither, so they ring nobody.

Reads are ``REPEATABLE READ READ ONLY`` snapshots: no lock, whole commands only.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

try:
    import psycopg
except ImportError as missing:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "the PostgreSQL store needs psycopg: pip install 'tether[postgresql]'"
    ) from missing

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
from tether.store.postgresql.schema import MIGRATIONS

#: The advisory lock every write transaction holds (one per database: its own writer).
WRITE_LOCK = 0x7E7E_0001
#: The advisory lock migrations hold, so processes starting together migrate once.
MIGRATION_LOCK = 0x7E7E_0002
#: The channel each commit notifies on.
CHANNEL = "tether_commit"

_OUTBOX_COLUMNS = "id, kind, payload, thread_id, attempts, last_error, parked"
_EVENT_COLUMNS = "seq, type, at, thread_id, run_id, task_id, token_id, data"



def _outbox_row(row: tuple[Any, ...]) -> OutboxRow:
    return OutboxRow(row[0], row[1], loads(row[2]), row[3], row[4], row[5], bool(row[6]))


def _event(row: tuple[Any, ...]) -> Event:
    return Event(*row)


def _order(table: Table) -> str:
    """SQLite's ``rowid`` (creation order) is ``pos`` here."""
    return "pos" if table.order == "rowid" else table.order


class _PGReader(Reader):
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def _one(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> tuple[Any, ...] | None:
        return self._conn.execute(sql, args).fetchone()

    def _where(self, table: Table, where: dict[str, Any]) -> tuple[str, list[Any]]:
        clauses, args = [], []
        for column, value in where.items():
            if column not in table.columns and column != table.key:
                raise ValueError(f"{table.name} cannot be filtered on {column}")
            if isinstance(value, list | set | tuple | frozenset):
                values = list(value)
                clauses.append(f"{column} = ANY(%s)" if values else "FALSE")
                if values:
                    args.append(values)
            elif value is None:
                clauses.append(f"{column} IS NULL")
            else:
                clauses.append(f"{column} = %s")
                args.append(value)
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", args

    def get(self, cls: type[R], key: str) -> R | None:
        table = TABLES[cls]
        row = self._one(f"SELECT data FROM {table.name} WHERE {table.key} = %s", (key,))
        return cls.from_dict(loads(row[0])) if row else None

    def find_rows(self, cls: type[Record], limit: int | None = None, **where: Any) -> list[tuple[str, str]]:
        table = TABLES[cls]
        clause, args = self._where(table, where)
        sql = f"SELECT {table.key}, data FROM {table.name}{clause} ORDER BY {_order(table)}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [(row[0], row[1]) for row in self._conn.execute(sql, args)]

    def value(self, cls: type[Record], key: str, column: str) -> Any:
        table = TABLES[cls]
        if column not in table.columns:
            raise ValueError(f"{table.name} has no column {column}")
        row = self._one(f"SELECT {column} FROM {table.name} WHERE {table.key} = %s", (key,))
        return row[0] if row else None

    def count(self, cls: type[Record], **where: Any) -> int:
        table = TABLES[cls]
        clause, args = self._where(table, where)
        row = self._one(f"SELECT COUNT(*) FROM {table.name}{clause}", args)
        return int(row[0]) if row else 0

    def get_request(self, scope: str, key: str) -> dict[str, Any] | None:
        row = self._one("SELECT response FROM requests WHERE scope = %s AND key = %s", (scope, key))
        return loads(row[0]) if row else None

    def get_meta(self, key: str) -> str | None:
        row = self._one("SELECT value FROM meta WHERE key = %s", (key,))
        return row[0] if row else None

    def outbox(self, limit: int = 100, due: float | None = None) -> list[OutboxRow]:
        sql, args = f"SELECT {_OUTBOX_COLUMNS} FROM outbox WHERE NOT parked", []
        if due is not None:
            sql += " AND retry_at <= %s"
            args.append(due)
        rows = self._conn.execute(sql + " ORDER BY id LIMIT %s", (*args, limit))
        return [_outbox_row(row) for row in rows]

    def parked(self, thread_id: str | None = None) -> list[OutboxRow]:
        sql, args = f"SELECT {_OUTBOX_COLUMNS} FROM outbox WHERE parked", []
        if thread_id is not None:
            sql += " AND thread_id = %s"
            args.append(thread_id)
        return [_outbox_row(row) for row in self._conn.execute(sql + " ORDER BY id", args)]

    def next_retry(self) -> float | None:
        row = self._one("SELECT MIN(retry_at) FROM outbox WHERE NOT parked AND attempts > 0")
        return row[0] if row else None


class _PGTransaction(_PGReader, Transaction):
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        super().__init__(conn)
        self._rang: set[str] = set()

    def _ring(self, what: str) -> None:
        """Tell the other processes, at commit, that this transaction wrote ``what``."""
        if what not in self._rang:
            self._conn.execute(f"NOTIFY {CHANNEL}, '{what}'")
            self._rang.add(what)

    def put(self, record: Record) -> None:
        table = TABLES[type(record)]
        names = (table.key, *table.columns)
        values = [getattr(record, name) for name in names]
        updates = ", ".join(f"{name} = excluded.{name}" for name in (*table.columns, "data"))
        self._conn.execute(
            f"INSERT INTO {table.name} ({', '.join(names)}, data) "
            f"VALUES ({', '.join(['%s'] * (len(names) + 1))}) "
            f"ON CONFLICT ({table.key}) DO UPDATE SET {updates}",
            (*values, dumps(record.to_dict())),
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
        self._ring("events")
        row = self._one(
            "INSERT INTO events (type, at, thread_id, run_id, task_id, token_id, data) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING seq",
            (type, now(), thread_id, run_id, task_id, token_id, dumps(data)),
        )
        return int(row[0]) if row else 0

    def add_outbox(self, kind: str, payload: dict[str, Any], thread_id: str | None = None) -> int:
        self._ring("outbox")
        row = self._one(
            "INSERT INTO outbox (kind, payload, thread_id, member) VALUES (%s, %s, %s, %s) RETURNING id",
            (kind, dumps(payload), thread_id, payload.get("member")),
        )
        return int(row[0]) if row else 0

    def remove_outbox(self, row_id: int) -> None:
        self._conn.execute("DELETE FROM outbox WHERE id = %s", (row_id,))

    def fail_outbox(self, row_id: int, error: str, retry_at: float | None) -> None:
        """The claim ends with the attempt: any process may retry the row when it is due."""
        self._conn.execute(
            "UPDATE outbox SET attempts = attempts + 1, last_error = %s, retry_at = %s, parked = %s, "
            "claimed_by = NULL, claimed_until = 0 WHERE id = %s",
            (error, retry_at or 0, retry_at is None, row_id),
        )

    def claim_outbox(self, member: str, now: float, lease: float, limit: int = 200) -> list[OutboxRow]:
        rows = self._conn.execute(
            "UPDATE outbox SET claimed_by = %(member)s, claimed_until = %(until)s WHERE id IN ("
            " SELECT id FROM outbox WHERE NOT parked AND retry_at <= %(now)s"
            " AND (member IS NULL OR member = %(member)s)"
            " AND (claimed_by IS NULL OR claimed_by = %(member)s OR claimed_until < %(now)s)"
            " ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED)"
            f" RETURNING {_OUTBOX_COLUMNS}",
            {"member": member, "until": now + lease, "now": now, "limit": limit},
        ).fetchall()
        return sorted((_outbox_row(row) for row in rows), key=lambda r: r.id)

    def beat(self, member: str, now: float, lease: float) -> list[str]:
        self._conn.execute(
            "INSERT INTO members (id, until) VALUES (%s, %s) "
            "ON CONFLICT (id) DO UPDATE SET until = excluded.until",
            (member, now + lease),
        )
        rows = self._conn.execute(
            "SELECT id FROM members WHERE until < %s AND id <> %s ORDER BY id", (now, member)
        )
        return [row[0] for row in rows]

    def forget_member(self, member: str) -> None:
        self._conn.execute("DELETE FROM outbox WHERE member = %s", (member,))
        self._conn.execute("DELETE FROM members WHERE id = %s", (member,))

    def put_request(self, scope: str, key: str, response: dict[str, Any]) -> None:
        self._conn.execute(
            "INSERT INTO requests (scope, key, response) VALUES (%s, %s, %s) "
            "ON CONFLICT (scope, key) DO UPDATE SET response = excluded.response",
            (scope, key, dumps(response)),
        )

    def set_meta(self, key: str, value: str) -> None:
        self._conn.execute(
            "INSERT INTO meta (key, value) VALUES (%s, %s) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )


class PostgreSQLStore(Store):
    #: Other processes may serve the same database (SPEC §12).
    shared = True

    def __init__(self, url: str) -> None:
        self.url = url
        self._owner = threading.get_ident()
        self._tx_depth = 0
        self._conn = self._connect()
        self._migrate()

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url, autocommit=True, application_name="tether")

    def _migrate(self) -> None:
        with self._conn.transaction():
            self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            self._conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = self._conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
            version = int(row[0] or 0) if row else 0
            for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
                self._conn.execute(script.encode())  # several statements: no parameters
                self._conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (number,))

    def _own(self) -> None:
        if threading.get_ident() != self._owner:
            raise ForeignThread(
                f"the store is owned by thread {self._owner} (the event loop's) and was used from "
                f"thread {threading.get_ident()} ({threading.current_thread().name}): store access "
                "must run on the loop (an `async def` route or dependency, never a thread pool)"
            )
        if self._conn.broken and not self._tx_depth:
            self._conn = self._connect()  # the server restarted or the network dropped

    @property
    def schema_version(self) -> int:
        self._own()
        row = self._conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        return int(row[0] or 0) if row else 0

    @contextmanager
    def _begin(self, statement: str, *setup: str) -> Iterator[None]:
        self._own()
        if self._tx_depth:
            raise RuntimeError("transactions do not nest: one command, one transaction")
        self._conn.execute(statement)
        self._tx_depth += 1
        try:
            for sql in setup:
                self._conn.execute(sql)
            yield
        except BaseException:
            if not self._conn.broken:
                self._conn.execute("ROLLBACK")
            raise
        else:
            self._conn.execute("COMMIT")
        finally:
            self._tx_depth -= 1

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        with self._begin("BEGIN", f"SELECT pg_advisory_xact_lock({WRITE_LOCK})"):
            yield _PGTransaction(self._conn)
        self.commits += 1

    @contextmanager
    def read(self) -> Iterator[Reader]:
        with self._begin("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"):
            yield _PGReader(self._conn)

    def events_after(
        self, seq: int, limit: int = 500, token_id: str | None = None, types: Sequence[str] = ()
    ) -> list[Event]:
        self._own()
        where, args = events_where(seq, token_id, types, "%s")
        sql = f"SELECT {_EVENT_COLUMNS} FROM events{where} ORDER BY seq LIMIT %s"
        rows = self._conn.execute(sql, (*args, limit))
        return [_event(row) for row in rows]

    def last_event_seq(self) -> int:
        self._own()
        row = self._conn.execute("SELECT MAX(seq) FROM events").fetchone()
        return int(row[0] or 0) if row else 0

    def prune_events(self, before: str) -> int:
        self._own()
        return self._conn.execute("DELETE FROM events WHERE at < %s", (before,)).rowcount

    async def rings(self, every: float) -> AsyncIterator[set[str]]:
        """What other processes' commits wrote (``events``, ``outbox``), as they commit —
        an empty set at least every ``every`` seconds (a missed notification only delays).
        Its own connection, used for nothing but listening; this store's own commits are
        left out (its process knows them)."""
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            await conn.execute(f"LISTEN {CHANNEL}")
            while True:
                rung: set[str] = set()
                async for note in conn.notifies(timeout=every, stop_after=1):
                    if note.pid != self._conn.info.backend_pid:
                        rung.add(note.payload)
                yield rung

    def close(self) -> None:
        self._own()
        self._conn.close()
