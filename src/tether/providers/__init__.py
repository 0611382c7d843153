"""Providers drive one thread's turns: the embedded ``script`` agent, and real agents."""

from tether.providers.base import Provider, Turn
from tether.providers.script import ScriptProvider

__all__ = ["Provider", "ScriptProvider", "Turn", "default_providers"]


def default_providers() -> dict[str, Provider]:
    return {"script": ScriptProvider()}
