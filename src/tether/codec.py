"""JSON as tether stores it and sends it on the event feed: orjson.

Every command encodes the records it saves and decodes the ones it loads, and every event
is encoded once and decoded by each follower: with the stdlib ``json`` that was a quarter
of a busy server's time; orjson does the same work several times faster. A value orjson
refuses (an integer beyond 64 bits) is encoded by the stdlib instead, so nothing that
encoded before fails now. Text is UTF-8, not ASCII-escaped; newlines and other control
characters are always escaped, so an encoded value is one line (the feed relies on it).
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":"))


def loads(text: str | bytes) -> Any:
    return orjson.loads(text)
