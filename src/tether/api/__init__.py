"""The HTTP API (SPEC §4): FastAPI routes over the environment's commands and queries."""

from tether.api.app import create_app

__all__ = ["create_app"]
