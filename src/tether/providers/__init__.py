"""Providers drive one thread's turns: the embedded ``script`` agent, and real agents.

Each provider is built from its section of ``config.toml`` (``[providers.NAME]``) and says
through ``check()`` whether it can run here (executable found, key present) and why not.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from tether.config import section
from tether.providers.base import Provider, Turn

__all__ = ["PROVIDERS", "Provider", "Turn", "load_providers", "usability"]

#: name -> "module:Class"; each class is built as ``Class(config_section)``.
PROVIDERS: dict[str, str] = {
    "script": "tether.providers.script:ScriptProvider",
    "claude": "tether.providers.claude.provider:ClaudeProvider",
    "codex": "tether.providers.codex:CodexProvider",
    "openai": "tether.providers.openai:OpenAIProvider",
}


def load_providers(config: dict[str, Any] | None = None) -> dict[str, Provider]:
    providers: dict[str, Provider] = {}
    for name, target in PROVIDERS.items():
        module, _, cls = target.partition(":")
        providers[name] = getattr(import_module(module), cls)(section(config or {}, "providers", name))
    return providers


def usability(providers: dict[str, Provider]) -> list[dict[str, Any]]:
    """``[{provider, usable, reason}]``: what ``tether providers`` and ``/api/providers`` show."""
    rows = []
    for name, provider in providers.items():
        problem = getattr(provider, "diagnose", provider.check)()  # the deeper check, if any
        rows.append({"provider": name, "usable": problem is None, "reason": problem})
    return rows
