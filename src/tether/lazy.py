"""Slow imports made after start-up, one at a time.

The server starts without the packages it needs only later (the ``mcp`` SDK, loaded on a
worker thread once it serves; an agent's SDK, with its first session). Two threads
importing overlapping packages at once can see one half made — "module 'mcp' has no
attribute 'shared'": Python's per-module import locks do not cover a submodule being set
on its package. So every such import goes through :func:`load`, which takes them in turn.
"""

from __future__ import annotations

import importlib
import threading
from types import ModuleType

_ONE_AT_A_TIME = threading.Lock()


def load(name: str) -> ModuleType:
    """``importlib.import_module(name)``, never beside another ``load``."""
    with _ONE_AT_A_TIME:
        return importlib.import_module(name)
