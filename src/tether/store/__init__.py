"""Persistence: one store interface (``base``), one package per backend (``sqlite``,
``postgresql``), and :func:`open_store`, the one place that picks a backend from a location."""

from __future__ import annotations

from pathlib import Path

from tether.store.base import Reader, Store, Transaction

__all__ = ["Reader", "Store", "Transaction", "open_store"]

#: URL schemes of PostgreSQL locations (libpq accepts both).
POSTGRESQL_SCHEMES = ("postgresql", "postgres")


def open_store(location: str | Path) -> Store:
    """The store at ``location``: a file path or ``sqlite:///PATH`` (SQLite, the default), or
    ``postgresql://…`` (PostgreSQL, with the ``postgresql`` extra). Other schemes are refused
    with a message that says which ones exist."""
    text = str(location)
    scheme, sep, rest = text.partition("://")
    if sep and scheme in POSTGRESQL_SCHEMES:
        from tether.store.postgresql import PostgreSQLStore

        return PostgreSQLStore(text)
    if sep and scheme != "sqlite":
        raise ValueError(
            f"no store backend for {scheme!r} locations; this tether has: sqlite (a file path), "
            "postgresql://USER@HOST/DB"
        )
    from tether.store.sqlite import SQLiteStore  # imported here: a backend loads only when chosen

    return SQLiteStore(Path(rest) if sep else Path(text))
