"""Persistence: one store interface (``base``), one package per backend (``sqlite``,
``postgresql``), and :func:`open_store`, the one place that picks a backend from a location."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tether.store.base import Reader, Store, Transaction

__all__ = ["Reader", "Store", "Transaction", "backend_of", "open_store"]

#: URL schemes of PostgreSQL locations (libpq accepts both).
POSTGRESQL_SCHEMES = ("postgresql", "postgres")


def open_store(location: str | Path) -> Store:
    """The store at ``location``: a file path or ``sqlite:///PATH`` (SQLite, the default), or
    ``postgresql://…`` (PostgreSQL, with the ``postgresql`` extra). Other schemes are refused
    with a message that says which ones exist."""
    text = str(location)
    if backend_of(text) == "postgresql":
        from tether.store.postgresql import PostgreSQLStore  # a backend loads only when chosen

        return PostgreSQLStore(text)
    from tether.store.sqlite import SQLiteStore

    _, sep, rest = text.partition("://")
    return SQLiteStore(Path(rest) if sep else Path(text))


def backend_of(location: str) -> str:
    """Which backend serves ``location`` (``sqlite`` or ``postgresql``), checked before
    anything starts; ValueError names what is wrong (an unknown scheme, a missing extra)."""
    scheme, sep, _ = location.partition("://")
    if not sep or scheme == "sqlite":
        return "sqlite"
    if scheme not in POSTGRESQL_SCHEMES:
        raise ValueError(
            f"no store backend for {scheme!r} locations; this tether has: sqlite (a file path), "
            "postgresql://USER@HOST/DB"
        )
    if importlib.util.find_spec("psycopg") is None:
        raise ValueError("a postgresql:// store needs psycopg: pip install 'tether[postgresql]'")
    return "postgresql"
