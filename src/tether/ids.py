"""Identifiers and timestamps.

Ids are opaque strings with a short prefix that says what they name (``thr_``, ``run_``,
``tsk_`` ...), so a log line or an error message is readable without a lookup.
"""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


#: The last whole second ``now`` formatted, and its text up to the fraction: every
#: command and event asks for the time, and ``strftime`` was a few percent of a busy server.
_second: tuple[int, str] = (-1, "")


def now() -> str:
    """The current time as ISO-8601 UTC with milliseconds, e.g. ``2026-12-02T12:53:21.123Z``."""
    global _second
    moment = time.time_ns() // 1_000_000
    second, millis = divmod(moment, 1000)
    if _second[0] != second:
        _second = (second, time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(second)))
    return f"{_second[1]}{millis:03d}Z"


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def parse_time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def millis_between(start: str, end: str) -> float:
    return (parse_time(end) - parse_time(start)).total_seconds() * 1000.0
