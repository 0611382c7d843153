"""The store interface every backend implements.

A command opens one transaction, reads the records it needs, and writes records, events
and outbox rows; commit makes all of it visible at once or none of it. That transaction
boundary is what the guarantees stand on (G2, G3, G6): there is no moment at which a
reader sees half a command.

The interface is synchronous on purpose. Commands are short functions over a
transaction; SQLite runs them inline on the event loop in well under a millisecond, and
PostgreSQL on the loop too, over one connection the loop's thread owns (round trips of a
fraction of a millisecond on loopback; more capacity comes from more processes, SPEC §12).
Every backend must pass ``tests/unit/store/contract.py`` (it subclasses ``StoreContract``
in its own ``test_<backend>.py``).

**One owner.** A store belongs to the thread that opened it (the event loop's thread in a
server) and refuses — with :class:`ForeignThread`, at once — any use from another thread,
so a request handler or SDK callback that slips into a thread pool fails the tests loudly
instead of interleaving its statements with a command's transaction.

Reads go through :meth:`Store.read`: a read-only snapshot that takes no write lock and
runs no settle step. Because commands are whole transactions, a read sees every command
entirely or not at all (G2).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

from tether.codec import loads
from tether.domain.records import Item, Link, Message, Record, Run, Send, Task, Thread, Token

R = TypeVar("R", bound=Record)


@dataclass(frozen=True)
class Table:
    """How a record kind is kept: its table, key field and the fields one may filter on."""

    name: str
    key: str
    columns: tuple[str, ...]
    order: str


TABLES: dict[type[Record], Table] = {
    Thread: Table("threads", "id", ("token_id",), "rowid"),
    Run: Table("runs", "id", ("thread_id", "status", "seq"), "seq"),
    Message: Table("messages", "id", ("thread_id", "seq", "run_id"), "seq"),
    Item: Table("items", "id", ("thread_id", "status", "kind", "task_id", "held"), "rowid"),
    Task: Table(
        "tasks",
        "id",
        (
            "parent_thread_id",
            "child_thread_id",
            "status",
            "follow_up_of",
            "parent_environment_id",
            "remote_pending",
            "label",
        ),
        "rowid",
    ),
    Token: Table("tokens", "id", ("hash", "kind", "thread_id"), "rowid"),
    Link: Table("links", "environment_id", (), "rowid"),
    Send: Table("sends", "id", ("environment_id", "status"), "rowid"),
}


@dataclass(frozen=True)
class Event:
    seq: int
    type: str
    at: str
    thread_id: str | None
    run_id: str | None
    task_id: str | None
    token_id: str | None
    #: The event's data as stored: JSON text. The feed sends it as it is, unread.
    text: str

    @property
    def id(self) -> str:
        return str(self.seq)

    @cached_property
    def data(self) -> dict[str, Any]:
        data: dict[str, Any] = loads(self.text)
        return data


@dataclass(frozen=True)
class OutboxRow:
    """A side effect to carry out. A row whose handler failed stays, with ``attempts`` and
    ``last_error``, and is retried with backoff; after repeated failures it is ``parked``:
    kept and shown (thread view, ``GET /api/outbox``), never deleted silently."""

    id: int
    kind: str
    payload: dict[str, Any]
    thread_id: str | None = None
    attempts: int = 0
    last_error: str | None = None
    parked: bool = False


class ForeignThread(RuntimeError):
    """The store was used from a thread that does not own it (see "One owner" above)."""


class Reader(ABC):
    """What a read-only snapshot offers: lookups, no writes."""

    @abstractmethod
    def get(self, cls: type[R], key: str) -> R | None: ...

    def find(self, cls: type[R], limit: int | None = None, **where: Any) -> list[R]:
        """Records whose indexed fields equal ``where`` (a list or set value means IN)."""
        return [cls.from_dict(loads(text)) for _, text in self.find_rows(cls, limit, **where)]

    @abstractmethod
    def find_rows(self, cls: type[Record], limit: int | None = None, **where: Any) -> list[tuple[str, str]]:
        """``find``, undecoded: each record's key and stored JSON, so a caller that already
        holds some of them decodes only the others."""

    @abstractmethod
    def count(self, cls: type[Record], **where: Any) -> int: ...

    @abstractmethod
    def value(self, cls: type[Record], key: str, column: str) -> Any:
        """One indexed column of one record (None if there is no such record), without
        decoding the record: what a command needs of a big thread is often just its fence."""

    @abstractmethod
    def get_request(self, scope: str, key: str) -> dict[str, Any] | None: ...

    @abstractmethod
    def get_meta(self, key: str) -> str | None: ...

    @abstractmethod
    def outbox(self, limit: int = 100, due: float | None = None) -> list[OutboxRow]:
        """Unparked rows in order; given ``due`` (epoch seconds), only those due by then."""

    @abstractmethod
    def parked(self, thread_id: str | None = None) -> list[OutboxRow]:
        """Rows parked after repeated failures (all, or one thread's)."""

    @abstractmethod
    def next_retry(self) -> float | None:
        """When the earliest unparked row that failed before is due again (epoch seconds)."""


class Transaction(Reader):
    """A read-write transaction: everything a command writes, committed together."""

    @abstractmethod
    def put(self, record: Record) -> None: ...

    @abstractmethod
    def append_event(
        self,
        type: str,
        data: dict[str, Any],
        *,
        thread_id: str | None = None,
        run_id: str | None = None,
        task_id: str | None = None,
        token_id: str | None = None,
    ) -> int: ...

    @abstractmethod
    def add_outbox(self, kind: str, payload: dict[str, Any], thread_id: str | None = None) -> int: ...

    @abstractmethod
    def remove_outbox(self, row_id: int) -> None: ...

    @abstractmethod
    def fail_outbox(self, row_id: int, error: str, retry_at: float | None) -> None:
        """Record a failed attempt: retry at ``retry_at`` (epoch seconds), or park the row."""

    @abstractmethod
    def put_request(self, scope: str, key: str, response: dict[str, Any]) -> None: ...

    @abstractmethod
    def set_meta(self, key: str, value: str) -> None: ...

    # Shared stores only (``Store.shared``: several processes serve one environment).

    def claim_outbox(self, member: str, now: float, lease: float, limit: int = 200) -> list[OutboxRow]:
        """Claim due, unparked rows for process ``member`` until ``now + lease``, in order:
        rows no live process holds (unclaimed, lease run out, or ``member``'s own) and that
        are for any process or for ``member`` (a payload's ``member``). A row stays
        claimed until removed or failed; a process that dies loses it when the lease ends."""
        raise NotImplementedError(f"{type(self).__name__} is not shared by several processes")

    def beat(self, member: str, now: float, lease: float) -> list[str]:
        """Process ``member`` is alive until ``now + lease``; returns the other processes
        whose lease has run out (gone for good, their work to recover)."""
        raise NotImplementedError(f"{type(self).__name__} is not shared by several processes")

    def forget_member(self, member: str) -> None:
        """Process ``member`` was recovered: drop it and the rows only it could carry out
        (stopping its turns, killing its processes — gone with it)."""
        raise NotImplementedError(f"{type(self).__name__} is not shared by several processes")


class Store(ABC):
    #: Read-write transactions committed since the store was opened. A backend counts its
    #: commits here; benchmarks report them per task (``GET /api/stats``).
    commits: int = 0
    #: Whether other processes may serve the same store at once (PostgreSQL, SPEC §12): then
    #: the environment's shared secrets live in it, and side effects are claimed with leases.
    shared: bool = False

    @abstractmethod
    def transaction(self) -> AbstractContextManager[Transaction]:
        """A read-write transaction: commits on normal exit, rolls back on an exception."""

    @abstractmethod
    def read(self) -> AbstractContextManager[Reader]:
        """A read-only snapshot: no write lock, sees only whole commands."""

    @abstractmethod
    def events_after(
        self, seq: int, limit: int = 500, token_id: str | None = None, types: Sequence[str] = ()
    ) -> list[Event]:
        """Stored events after ``seq`` in store order: only the fence's, given a token, and
        only of ``types``, if given (an entry ending in ``.`` is a prefix: ``task.``)."""

    @abstractmethod
    def last_event_seq(self) -> int: ...

    @abstractmethod
    def prune_events(self, before: str) -> int:
        """Drop events older than ``before`` (the retention period); returns how many."""

    def rings(self, every: float) -> AsyncIterator[set[str]]:
        """Shared stores: what other processes' commits wrote (``events``, ``outbox``), as
        they commit, and an empty set at least every ``every`` seconds."""
        raise NotImplementedError(f"{type(self).__name__} is not shared by several processes")

    @abstractmethod
    def close(self) -> None: ...


def events_where(seq: int, token_id: str | None, types: Sequence[str], mark: str) -> tuple[str, list[Any]]:
    """The WHERE clause of ``events_after`` and its arguments, with the backend's
    placeholder ``mark`` (``?``, ``%s``): one definition of which events a feed reads."""
    clauses, args = [f"seq > {mark}"], [seq]
    if token_id is not None:
        clauses.append(f"token_id = {mark}")
        args.append(token_id)
    if types:
        either = [
            f"substr(type, 1, {len(kind)}) = {mark}" if kind.endswith(".") else f"type = {mark}"
            for kind in types
        ]
        clauses.append(f"({' OR '.join(either)})")
        args.extend(types)
    return " WHERE " + " AND ".join(clauses), args
