"""The one bounded poll, for state that no event announces (a process reaped, a link's
status read over HTTP). Every other wait is a server-side ``/wait`` or the event feed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll(fn: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """``fn()`` until it is truthy; fails with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)  # polling interval: there is no event to await for this
