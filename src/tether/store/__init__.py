"""Persistence: one store interface (``base``), one package per backend (``sqlite``), and
:func:`open_store`, the one place that picks a backend from a location."""

from __future__ import annotations

from pathlib import Path

from tether.store.base import Reader, Store, Transaction

__all__ = ["Reader", "Store", "Transaction", "open_store"]


def open_store(location: str | Path) -> Store:
    """The store at ``location``: a file path or ``sqlite:///PATH`` (SQLite, the default).
    Other schemes are refused with a message that says which ones exist."""
    text = str(location)
    scheme, sep, rest = text.partition("://")
    if sep and scheme != "sqlite":
        raise ValueError(f"no store backend for {scheme!r} locations; this tether has: sqlite (a file path)")
    from tether.store.sqlite import SQLiteStore  # imported here: a backend loads only when chosen

    return SQLiteStore(Path(rest) if sep else Path(text))
