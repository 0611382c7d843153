"""The SQLite backend (the default): one file, WAL, one owning thread. ``schema`` holds its
numbered migrations; ``store`` the :class:`SQLiteStore` itself."""

from tether.store.sqlite.store import SQLiteStore

__all__ = ["SQLiteStore"]
