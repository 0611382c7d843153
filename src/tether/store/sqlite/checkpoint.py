"""Checkpoints of the write-ahead log, on a thread of their own.

A checkpoint copies committed pages from the WAL into the database file and syncs both.
SQLite runs one inside whichever COMMIT takes the WAL past 1,000 pages: on the event loop,
where it was about a sixth of a busy server's time (#13), and where its syncs stall every
request. So the owning connection raises that threshold to a backstop (``BACKSTOP``
pages: taken only if this thread falls behind or dies) and this thread, on a connection of
its own, runs a PASSIVE checkpoint — one that never waits for nor blocks the writer or a
reader — after every ``EVERY`` commits, or within a second of the last one. ``sqlite3``
lets go of the GIL while SQLite works, so the copy and its syncs run beside the loop.

This thread reads and writes no record: the one owner of the store (``store/base.py``)
is about what transactions see, and a checkpoint changes nothing that any of them sees.
"""

from __future__ import annotations

import logging
import sqlite3
import threading

log = logging.getLogger(__name__)

#: Commits between two checkpoints (a busy server commits a few hundred a second).
EVERY = 50
#: The owning connection's own threshold, in pages (4 KiB each): a backstop.
BACKSTOP = 10_000


class Checkpointer:
    def __init__(self, path: str) -> None:
        self._path = path
        self._pending = 0
        self._wake = threading.Event()
        #: Set after each checkpoint (what a test waits for).
        self.checkpointed = threading.Event()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="tether-checkpoint", daemon=True)
        self._thread.start()

    def committed(self) -> None:
        """Called by the owner after each commit (a hint: a lost count costs nothing)."""
        self._pending += 1
        if self._pending >= EVERY:
            self._wake.set()

    def close(self) -> None:
        self._closing = True
        self._wake.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        try:
            conn = sqlite3.connect(self._path, isolation_level=None)
        except sqlite3.Error:
            log.exception("no checkpoint thread for %s: the writer checkpoints itself", self._path)
            return
        try:
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=5000")
            while not self._closing:
                self._wake.wait(1.0)
                self._wake.clear()
                if self._pending:
                    self._pending = 0
                    self._checkpoint(conn)
        finally:
            conn.close()

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except Exception:  # whatever it is, logged, and the thread goes on (never dies silently)
            log.exception("a checkpoint of %s failed; trying again after the next commits", self._path)
        else:
            self.checkpointed.set()
