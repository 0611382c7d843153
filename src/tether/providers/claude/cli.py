"""Finding and loading Claude Code: the SDK (imported with the first session — it is slow
to import, and ``tether providers`` or a server without claude threads need not pay for
it), the CLI bundled in its wheel, and the shim tether starts it through."""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
from pathlib import Path
from typing import Any

from tether import lazy


@functools.cache
def load_sdk() -> Any:
    """``claude_agent_sdk``, imported once, when first needed (it imports the ``mcp`` SDK,
    which the server may be loading on a worker thread just then: see ``tether.lazy``)."""
    return lazy.load("claude_agent_sdk")


#: The executable tether gives the SDK: it starts Claude Code in a session (process group)
#: of its own and writes its pid down. A stop of tether — SIGKILL, or SIGTERM, whose
#: clean-up kills the SDK's child — then ends this shim only: the CLI lives on while it has
#: background work, finishes it, writes its wake turn into the session's transcript and
#: exits; the restarted tether adopts it (``ClaudeProvider.adopt``).
SHIM = """#!{python}
import os, signal, subprocess, sys
env = dict(os.environ)
cli, pidfile = env.pop("TETHER_CLAUDE_CLI"), env.pop("TETHER_CLAUDE_PIDFILE")
child = subprocess.Popen([cli, *sys.argv[1:]], env=env, start_new_session=True)
with open(pidfile + ".tmp", "w") as out:
    out.write(str(child.pid))
os.replace(pidfile + ".tmp", pidfile)
signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
code = child.wait()
sys.exit(code if code >= 0 else 128 - code)
"""
INSTALL = "pip install 'tether[claude]'"


def bundled_cli() -> str | None:
    """The Claude Code executable inside the installed ``claude-agent-sdk`` wheel."""
    spec = importlib.util.find_spec("claude_agent_sdk")
    for root in (spec.submodule_search_locations or []) if spec else []:
        found = Path(root) / "_bundled" / "claude"
        if found.is_file() and os.access(found, os.X_OK):
            return str(found)
    return None


def version_problem(executable: str) -> str | None:
    """None if ``executable --version`` runs; else what it said."""
    try:
        done = subprocess.run(
            [executable, "--version"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"Claude Code at {executable} does not run: {exc}"
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return f"Claude Code at {executable} does not run (exit {done.returncode}): {' '.join(said)}"
    return None
