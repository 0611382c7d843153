"""Wake waiters when a commit touches what they wait on.

Waiters name keys (``thread:ID``, ``task:ID``, ``events``); after each commit the engine
calls :meth:`Notifier.notify` with the keys the command touched. A waiter re-checks its
condition against the store each time, so a notification is a hint, never the truth —
missing or extra notifications cannot make a wait return a wrong answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


class Notifier:
    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Event]] = defaultdict(set)

    def notify(self, keys: Iterable[str]) -> None:
        for key in keys:
            for event in self._waiters.get(key, ()):
                event.set()

    async def wait_until(
        self, keys: Iterable[str], check: Callable[[], T | None], timeout: float | None
    ) -> T | None:
        """Return ``check()`` once it is not None, or None when ``timeout`` seconds pass."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        event = asyncio.Event()
        keys = list(keys)
        for key in keys:
            self._waiters[key].add(event)
        try:
            while True:
                event.clear()  # before the check: a commit after it sets the event again
                result = check()
                if result is not None:
                    return result
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), remaining)
        finally:
            for key in keys:
                self._waiters[key].discard(event)
                if not self._waiters[key]:
                    del self._waiters[key]
