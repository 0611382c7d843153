"""The REAL Claude Code CLI under tether: the executable the ``claude-agent-sdk`` wheel
bundles, pointed at the scripted model server (``anthropic_server``), and ``tether serve``
processes whose ``claude`` provider runs it.

Tests using this skip only when the bundled CLI is genuinely missing (a wheel without it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tether.launch import Server
from tether.providers.claude.cli import bundled_cli

from .anthropic_server import ModelServer

requires_cli = pytest.mark.skipif(bundled_cli() is None, reason="the claude-agent-sdk wheel bundles no CLI")


def cli_env(model: ModelServer, root: Path) -> dict[str, str]:
    """What the CLI needs to talk to the scripted model, and nothing of this machine's own
    Claude Code set-up (its config directory is the test's)."""
    return {
        "ANTHROPIC_BASE_URL": model.url,
        "ANTHROPIC_API_KEY": "sk-ant-test-not-a-secret",
        "IS_SANDBOX": "1",  # we run as root: without it the CLI refuses bypassPermissions
        "CLAUDE_CONFIG_DIR": str(root / "claude-config"),
        "DISABLE_AUTOUPDATER": "1",
    }


class CliServer(Server):
    """A server given more time to start: the CI machine is shared, and a start beside a
    running Claude Code (a 400 MB executable) can be slow."""

    def start(self, timeout: float = 60.0) -> CliServer:
        super().start(timeout)
        return self


def claude_server(
    data: Path, name: str, model: ModelServer, extra: str = "", server_type: type[Server] = CliServer
) -> Server:
    """A ``tether serve`` (not started) whose ``claude`` provider runs the bundled CLI."""
    data.mkdir(parents=True, exist_ok=True)
    (data / "config.toml").write_text(
        f'[providers.claude]\ncli_path = "{bundled_cli()}"\nwake_grace_s = 5\n{extra}'
    )
    return server_type(data, name, env=cli_env(model, data.parent))


def model_script(**turns: Any) -> str:
    """A task text that scripts the model (see ``anthropic_server``)."""
    return json.dumps({"model_script": turns})


def bash(command: str, background: bool = False) -> dict[str, Any]:
    step_input: dict[str, Any] = {"command": command, "description": "run it"}
    if background:
        step_input["run_in_background"] = True
    return {"tool": "Bash", "input": step_input}


def load(tool: str) -> dict[str, Any]:
    """ToolSearch for a deferred tool (Monitor, tether's MCP tools): Claude Code offers
    their schemas only after it."""
    return {"tool": "ToolSearch", "input": {"query": f"select:{tool}"}}


def monitor(command: str, timeout_ms: int = 60000, persistent: bool = False) -> dict[str, Any]:
    step_input: dict[str, Any] = {"command": command, "description": "watch it", "timeout_ms": timeout_ms}
    if persistent:
        step_input["persistent"] = True
    return {"tool": "Monitor", "input": step_input}


def say(text: str) -> dict[str, Any]:
    return {"text": text}
