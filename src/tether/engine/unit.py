"""A unit of work: one transaction plus an identity map and the list of threads to
reconcile before commit — and :class:`View`, its read-only half over a snapshot.

Every record is loaded once per unit (``load``/``query`` hand back the same object for the
same key). That removes a whole class of bug: two helpers holding two copies of one thread
and the second ``put`` silently undoing the first.

Writes are behind, not through: a command that saves one thread five times writes it
once. Saved records are put before the next query of their table (so it sees them,
through its filter columns) and all at the end (``write``); events wait for the end too, and an
``*.updated`` event replaces the one before it for the same record (a reader can never see
the state in between: it was never committed). Nothing of this is visible outside the
transaction, so it is the same history with less encoding.
"""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple, TypeVar

from tether.codec import loads
from tether.domain.records import Record, Thread
from tether.errors import NotFound
from tether.ids import now
from tether.store.base import TABLES, Reader, Transaction

R = TypeVar("R", bound=Record)


class View:
    """Records read from one snapshot, each loaded once. Queries use it: no write lock."""

    def __init__(self, reader: Reader, environment_id: str) -> None:
        self.reader = reader
        self.environment_id = environment_id
        self.at = now()
        self._cache: dict[tuple[type, str], Record] = {}

    def _key(self, record: Record) -> tuple[type, str]:
        return type(record), getattr(record, TABLES[type(record)].key)

    def load(self, cls: type[R], key: str | None) -> R | None:
        if key is None:
            return None
        cached = self._cache.get((cls, key))
        if cached is not None:
            return cached  # type: ignore[return-value]
        record = self.reader.get(cls, key)
        if record is not None:
            self._cache[(cls, key)] = record
        return record

    def need(self, cls: type[R], key: str, what: str) -> R:
        record = self.load(cls, key)
        if record is None:
            raise NotFound(f"no {what} with id {key!r}")
        return record

    def query(self, cls: type[R], limit: int | None = None, **where: Any) -> list[R]:
        """Records found by the store, each the one this view already holds if it does
        (then it is not decoded again: settling asks about the same runs several times)."""
        self._put_saved(cls)
        found = []
        for key, text in self.reader.find_rows(cls, limit, **where):
            record = self._cache.get((cls, key))
            if record is None:
                record = self._cache[(cls, key)] = cls.from_dict(loads(text))
            found.append(record)
        return found  # type: ignore[return-value]

    def count(self, cls: type[Record], **where: Any) -> int:
        self._put_saved(cls)
        return self.reader.count(cls, **where)

    def _put_saved(self, cls: type[Record] | None = None) -> None:
        """Nothing to write in a read-only view (see ``Unit``)."""


class Unit(View):
    """A command's transaction: the view plus writes, events and outbox rows."""

    def __init__(self, tx: Transaction, environment_id: str) -> None:
        super().__init__(tx, environment_id)
        self.tx = tx
        #: Threads whose runs or background work changed, in the order they changed.
        self.dirty: dict[str, None] = {}
        #: Keys ("thread:ID", "task:ID", "events") whose waiters should wake after commit.
        self.touched: set[str] = set()
        self._saved: dict[tuple[type, str], Record] = {}
        #: Events to append at the end, keyed so an ``*.updated`` replaces its predecessor.
        self._events: dict[tuple[Any, ...], _Event] = {}
        self._numbers = itertools.count()

    def save(self, record: Record) -> None:
        key = self._key(record)
        self._cache[key] = record
        self._saved[key] = record

    def _put_saved(self, cls: type[Record] | None = None) -> None:
        """Put the saved records (only those of ``cls``: a query reads one table)."""
        if cls is None:
            saved, self._saved = self._saved, {}
        else:
            saved = {key: record for key, record in self._saved.items() if key[0] is cls}
            for key in saved:
                del self._saved[key]
        for record in saved.values():
            self.tx.put(record)

    def emit(
        self,
        type: str,
        data: dict[str, Any],
        *,
        thread_id: str | None = None,
        run_id: str | None = None,
        task_id: str | None = None,
    ) -> None:
        """Append an event (at the end of the unit). Its fence token is the thread's: a
        peer sees what it created. A later ``*.updated`` of the same record replaces this
        one: both carry the record's whole view, and only the last was ever committed."""
        event = _Event(type, data, thread_id, run_id, task_id, self._fence(thread_id))
        key: tuple[Any, ...] = (type, thread_id, run_id, task_id)
        if not type.endswith(".updated"):
            key = (next(self._numbers), *key)
        self._events.pop(key, None)
        self._events[key] = event
        self.touched.add("events")
        if thread_id:
            self.touched.add(f"thread:{thread_id}")
        if task_id:
            self.touched.add(f"task:{task_id}")

    def _fence(self, thread_id: str | None) -> str | None:
        """The thread's token id: from the record if this unit has it, else from its column
        (a parent with a thousand tasks is a big record to decode for one id)."""
        if thread_id is None:
            return None
        thread = self._cache.get((Thread, thread_id))
        if isinstance(thread, Thread):
            return thread.token_id
        token_id: str | None = self.reader.value(Thread, thread_id, "token_id")
        return token_id

    def outbox(self, kind: str, payload: dict[str, Any], thread_id: str | None = None) -> None:
        """A side effect to carry out after commit (see ``tether.engine.runtime``), on
        behalf of ``thread_id`` (where a failure that keeps failing is shown)."""
        self.tx.add_outbox(kind, payload, thread_id)
        self.touched.add("outbox")

    def mark(self, thread_id: str) -> None:
        self.dirty[thread_id] = None

    def write(self) -> None:
        """Put every saved record and append the events, in order: the unit's last step
        before commit."""
        self._put_saved()
        events, self._events = self._events, {}
        for event in events.values():
            self.tx.append_event(
                event.type,
                event.data,
                thread_id=event.thread_id,
                run_id=event.run_id,
                task_id=event.task_id,
                token_id=event.token_id,
            )


class _Event(NamedTuple):
    type: str
    data: dict[str, Any]
    thread_id: str | None
    run_id: str | None
    task_id: str | None
    token_id: str | None
