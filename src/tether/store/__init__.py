"""Persistence: one store interface (``base``), one module per backend (``sqlite``)."""

from tether.store.base import Store, Transaction
from tether.store.sqlite import SQLiteStore

__all__ = ["SQLiteStore", "Store", "Transaction"]
