"""The ``codex`` provider where no Codex is installed. Everything Codex does is tested
against the real CLI, in test_codex_real.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tether.launch import Server
from tether.providers.codex import INSTALL


def test_an_unusable_codex_is_refused_with_a_reason(server: Server) -> None:
    """The default environment has no codex executable: creating a codex thread says why."""
    with server.client() as client:
        created = client.post("/api/threads", json={"provider": "codex", "message": "hi"})
    assert created.status_code in (400, 422), created.text
    assert "not found" in created.json()["error"]["message"]


def test_tether_providers_says_how_to_install_codex(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text('[providers.codex]\nexecutable = "no-such-codex-here"\n')
    done = subprocess.run(
        [sys.executable, "-m", "tether", "providers", "--data", str(tmp_path), "--json"],
        capture_output=True, text=True, check=True, timeout=60,
    )
    [codex] = [row for row in json.loads(done.stdout) if row["provider"] == "codex"]
    assert codex["usable"] is False
    assert INSTALL in codex["reason"] and INSTALL == "npm install -g @openai/codex@0.169.0"
