"""Identifiers and timestamps.

Ids are opaque strings with a short prefix that says what they name (``thr_``, ``run_``,
``tsk_`` ...), so a log line or an error message is readable without a lookup.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


def now() -> str:
    """The current time as ISO-8601 UTC with milliseconds, e.g. ``2026-12-02T12:53:21.123Z``."""
    return format_time(datetime.now(UTC))


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def parse_time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def millis_between(start: str, end: str) -> float:
    return (parse_time(end) - parse_time(start)).total_seconds() * 1000.0
