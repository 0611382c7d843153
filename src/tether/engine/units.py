"""How a command runs: its unit of work, the deferred writes of running turns, the
at-most-once rule (G9), and the read-only snapshot queries take.

:class:`Units` is what every command module holds. ``unit()`` is one command's
transaction: deferred writes first, then the command, then the reconcile kernel
(:func:`tether.engine.kernel.settle`), then the commit — or, on any error, nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from tether.engine.kernel import settle
from tether.engine.unit import Unit, View
from tether.errors import Invalid
from tether.store.base import Store
from tether.types import Caller

log = logging.getLogger(__name__)

#: Deferred writes nothing else carried are committed this many seconds after the first
#: of them: on a busy loop a command nearly always comes first and takes them along (a
#: fifth of the transactions of a fan-out were flushes of their own when it was the loop's
#: next turn). Nothing waits on them: a reader in this process flushes first.
FLUSH_DELAY = 0.003
#: A flush of deferred writes that failed (the store was locked, say) is tried again after
#: this many seconds, unless a command carries them first.
FLUSH_RETRY = 1.0

#: A write that nothing waits on, applied later inside some command's unit (see ``later``).
Deferred = Callable[[Unit], object]


class Units:
    def __init__(
        self,
        store: Store,
        environment_id: str,
        providers: Mapping[str, Any] | Iterable[str] = ("script",),
        on_commit: Callable[[set[str]], None] | None = None,
    ) -> None:
        self.store = store
        self.environment_id = environment_id
        #: name -> provider; only ``check()`` is used here, to refuse an unusable one early.
        self.providers: Mapping[str, Any] = (
            providers if isinstance(providers, Mapping) else dict.fromkeys(providers)
        )
        self._on_commit = on_commit
        #: ``[tasks] default_deadline_ms`` of ``config.toml``: the deadline of every task
        #: delegated from here without one of its own (None: no deadline).
        self.default_deadline_ms: int | None = None
        #: Writes of running turns not yet applied, oldest first (see ``later``).
        self._deferred: list[Deferred] = []
        self._flush_armed = False

    @contextmanager
    def unit(self) -> Iterator[Unit]:
        """One command's transaction. Deferred writes go first, in order, so the command
        (and everything after it) sees them; a rollback hands them to the next command."""
        deferred, self._deferred = self._deferred, []
        try:
            with self.store.transaction() as tx:
                u = Unit(tx, self.environment_id)
                self._apply_deferred(u, deferred)
                yield u
                settle(u)
                u.write()
        except BaseException:
            self._deferred[:0] = deferred
            raise
        if self._on_commit and u.touched:
            self._on_commit(u.touched)

    @contextmanager
    def view(self) -> Iterator[View]:
        """A read-only snapshot for queries: no write lock, no settle step, no commit hook.
        It sees every command whole or not at all, since a command is one transaction.
        Deferred writes are applied first, so a reader in this process reads its writes."""
        self.flush()
        with self.snapshot() as view:
            yield view

    @contextmanager
    def snapshot(self) -> Iterator[View]:
        """``view`` without the flush: for reads of what deferred writes never touch
        (tokens), so that authenticating a request, or a feed checking its token, does not
        commit a running turn's writes early."""
        with self.store.read() as reader:
            yield View(reader, self.environment_id)

    def once(
        self, caller: Caller, name: str, key: str | None, body: Callable[[Unit], dict[str, Any]]
    ) -> dict[str, Any]:
        """Run ``body`` in one unit, at most once per (caller, ``name``, ``key``) (G9)."""
        with self.unit() as u:
            return _once_in(u, caller, name, key, body)

    def once_each(
        self, caller: Caller, name: str, calls: list[tuple[str, Callable[[Unit], dict[str, Any]]]]
    ) -> list[dict[str, Any]]:
        """``once`` for several (key, body) calls in one unit, in order: all of them, or —
        if any raises — none. One commit instead of one each, for a caller that can retry
        them one by one when one is refused."""
        with self.unit() as u:
            return [_once_in(u, caller, name, key, body) for key, body in calls]

    def check_provider(self, name: str) -> None:
        if name not in self.providers:
            known = ", ".join(sorted(self.providers))
            raise Invalid(f"unknown provider {name!r}; this environment has: {known}")
        problem = getattr(self.providers[name], "check", lambda: None)()
        if problem:
            raise Invalid(f"provider {name!r} is not usable here: {problem}")

    # ------------------------------------------------------------------ deferred writes

    def later(self, write: Deferred) -> None:
        """Queue a write that nothing waits on — a turn's start time, its provider state,
        what it says — instead of committing it alone. It joins the transaction of the next
        command (whichever comes first: that run's next tool call or its end, another
        command, a query) or, failing that, its own one ``FLUSH_DELAY`` later. Writes are
        only delayed, never reordered, so this is the same history with fewer commits: a
        crash before the flush loses what a crash a moment earlier would have lost. Each
        write re-checks what it depends on (its run still running) and must not raise.
        Without a running loop (scripts, tests) it is applied at once."""
        self._deferred.append(write)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        if not self._flush_armed:
            self._flush_armed = True
            loop.call_later(FLUSH_DELAY, self._flush_soon)

    def claim(self, write: Callable[[Unit], bool]) -> bool:
        """A write that says this process owns a run or a process. Several processes on one
        store (SPEC §12) need its answer before they go on, so it commits at once; a process
        alone on its store owns everything, so it is deferred (``later``) and holds."""
        if self.store.shared:
            with self.unit() as u:
                return write(u)
        self.later(write)
        return True

    def _flush_soon(self) -> None:
        self._flush_armed = False
        try:
            self.flush()
        except Exception:
            log.exception("deferred writes could not be committed; trying again")
            self._flush_armed = True
            asyncio.get_running_loop().call_later(FLUSH_RETRY, self._flush_soon)

    def flush(self) -> None:
        """Commit the deferred writes now (one transaction), if there are any."""
        if self._deferred:
            with self.unit():
                pass

    def _apply_deferred(self, u: Unit, deferred: list[Deferred]) -> None:
        for write in list(deferred):
            try:
                write(u)
            except Exception:
                # A bug, not a state: drop that write (the transaction rolls back and the
                # others move on to the next command) rather than fail every command after.
                log.exception("a deferred write failed and was dropped")
                deferred.remove(write)
                raise


def _once_in(
    u: Unit, caller: Caller, name: str, key: str | None, body: Callable[[Unit], dict[str, Any]]
) -> dict[str, Any]:
    """``body`` in the unit ``u``, unless (caller, ``name``, ``key``) ran before: then what
    it answered then. The answer is kept in the same transaction as what it did."""
    if key:
        seen = u.tx.get_request(caller.scope, f"{name}:{key}")
        if seen is not None:
            return seen
    result = body(u)
    if key:
        u.tx.put_request(caller.scope, f"{name}:{key}", result)
    return result
