"""What a provider gets for one turn, and what it must do: the engine's provider port
(:mod:`tether.engine.port`), named here for the providers that implement it."""

from __future__ import annotations

from tether.engine.port import Provider, Services, Turn

__all__ = ["Provider", "Services", "Turn"]
