"""Records as last committed, by table and key, so a read by key needs no statement.

Commands and the reads around them load the same records by key again and again: over one
task of a fan-out the origin loaded the child's run by id nine times and its task six,
each time a ``SELECT`` — and every command is a new unit, so the unit's own identity map
cannot help. This keeps the stored JSON of each record this connection read or committed
(the text, not the object: commands change the records they load, and each load decodes
its own copy).

It can never be stale for this process, which is the store's one writer (one server per
data directory, docs/architecture.md):

- what a transaction puts enters it only when the transaction commits (``commit``); a
  rollback leaves it as it was;
- what a read finds enters it (``note``) only if it was committed: a transaction's own puts
  are answered from the transaction (``_SQLiteTransaction``), never noted;
- ``PRAGMA data_version`` changes when another connection commits to the file (a second
  process, against the rule) or resets the write-ahead log: ``check``, at the start of
  every transaction, then forgets everything.

Beside each record's JSON it keeps the values of its filter columns as stored, so that an
update can set only the columns that changed: SQLite rewrites an entry in every index
whose column an ``UPDATE`` sets, changed or not, and each rewritten index is one more
page in the write-ahead log of the commit (``store.py``'s ``put``).

It holds at most ``LIMIT`` records, and forgets them all when full (no eviction order to
keep up on every read).
"""

from __future__ import annotations

import sqlite3
from typing import Any, NamedTuple

#: Records kept at most (a record's JSON is about a kilobyte, so a few megabytes).
LIMIT = 10_000


class Stored(NamedTuple):
    """A record's row as stored: its JSON and its filter columns' values, in table order."""

    text: str
    columns: tuple[Any, ...]


class Committed:
    def __init__(self) -> None:
        self._texts: dict[tuple[str, str], Stored] = {}
        self._version: int | None = None

    def check(self, conn: sqlite3.Connection) -> None:
        """At the start of a transaction: forget everything if another connection wrote."""
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        if version != self._version:
            self._texts.clear()
            self._version = version

    def get(self, table: str, key: str) -> Stored | None:
        return self._texts.get((table, key))

    def note(self, table: str, key: str, stored: Stored) -> None:
        """A committed record's row, just read."""
        if len(self._texts) >= LIMIT:
            self._texts.clear()
        self._texts[(table, key)] = stored

    def commit(self, written: dict[tuple[str, str], Stored]) -> None:
        """What a transaction put, now that it committed."""
        if len(self._texts) + len(written) > LIMIT:
            self._texts.clear()
        self._texts.update(written)
