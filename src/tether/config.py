"""``DATA/config.toml``: providers, models and defaults of one environment.

Everything is optional; an environment without the file runs the ``script`` provider.

```toml
[providers.openai]            # any OpenAI-compatible chat-completions endpoint
base_url = "http://127.0.0.1:11434/v1"
model = "qwen2.5-coder"
api_key_env = "OPENAI_API_KEY"

[providers.claude]            # Claude Code through claude-agent-sdk (pip install 'tether[claude]')
cli_path = "claude"           # default: the CLI the SDK bundles
model = "sonnet"
permission_mode = "bypassPermissions"

[providers.codex]             # codex exec --json (npm install -g @openai/codex@0.169.0)
executable = "codex"
model = "gpt-5.5"
api_key_env = "CODEX_API_KEY"

[events]
retention_days = 7            # events, and ended background commands' files (DATA/proc)

[tasks]
default_deadline_ms = 3600000  # every task delegated from here without a deadline gets this one
```

docs/agents.md lists every key of each provider.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from tether.domain.deadlines import check as check_deadline
from tether.domain.types import DomainError
from tether.errors import Invalid


def load_config(data_dir: Path) -> dict[str, Any]:
    path = data_dir / "config.toml"
    if not path.exists():
        return {}
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise Invalid(f"{path}: {error}") from None


def section(config: dict[str, Any], *names: str) -> dict[str, Any]:
    value: Any = config
    for name in names:
        value = value.get(name, {}) if isinstance(value, dict) else {}
    return value if isinstance(value, dict) else {}


def default_deadline_ms(config: dict[str, Any]) -> int | None:
    """``[tasks] default_deadline_ms`` (SPEC §11): None when unset; a bad value stops the
    start with a message that names the key, rather than arming nonsense."""
    value = section(config, "tasks").get("default_deadline_ms")
    try:
        check_deadline(value, None)
    except DomainError as error:
        raise Invalid(f"config.toml [tasks] default_deadline_ms: {error}") from None
    return value
