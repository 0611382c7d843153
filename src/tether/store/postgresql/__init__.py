"""The PostgreSQL backend (``pip install 'tether[postgresql]'``): one database serves one
environment, from one or several ``tether serve`` processes (SPEC §12). ``schema`` holds
its numbered migrations; ``store`` the :class:`PostgreSQLStore`."""

from tether.store.postgresql.store import PostgreSQLStore

__all__ = ["PostgreSQLStore"]
