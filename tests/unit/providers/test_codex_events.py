"""Reading ``codex exec --json`` lines: what is said, what the reply is, what fails a run."""

from __future__ import annotations

import signal
import subprocess
from typing import Any

import pytest

from tether.providers.codex import (
    DEFAULT_MODEL,
    INSTALL,
    CodexError,
    CodexEvents,
    CodexProvider,
    _started,
    end_leftover,
    turn_usage,
)


def message(item_id: str, text: str, kind: str = "item.completed") -> dict[str, Any]:
    return {"type": kind, "item": {"id": item_id, "type": "agent_message", "text": text}}


def run(*events: dict[str, Any]) -> tuple[CodexEvents, list[str]]:
    found, said = CodexEvents(), []
    for event in events:
        said += found.feed(event)
    return found, said


def test_a_turn_says_its_messages_and_replies_with_the_last() -> None:
    events, said = run(
        {"type": "thread.started", "thread_id": "0199-abc"},
        {"type": "turn.started"},
        {"type": "item.completed", "item": {"id": "item_0", "type": "reasoning", "text": "hmm"}},
        message("item_1", "Looking."),
        {
            "type": "item.started",
            "item": {
                "id": "item_2",
                "type": "command_execution",
                "command": "ls",
                "aggregated_output": "",
                "exit_code": None,
                "status": "in_progress",
            },
        },
        {
            "type": "item.completed",
            "item": {
                "id": "item_2",
                "type": "command_execution",
                "command": "ls",
                "aggregated_output": "a\n",
                "exit_code": 0,
                "status": "completed",
            },
        },
        message("item_3", "Done."),
        message("item_3", "Done."),
        {
            "type": "turn.completed",
            "usage": {"input_tokens": 1, "cached_input_tokens": 0, "output_tokens": 1},
        },
    )
    assert events.thread_id == "0199-abc"
    assert said == ["Looking.", "Done."]
    assert events.outcome(0) == "Done."


def test_an_agent_message_seen_only_in_progress_is_the_reply() -> None:
    events, said = run(message("item_0", "partial", "item.updated"), {"type": "turn.completed", "usage": {}})
    assert said == [] and events.outcome(0) == "partial"


def test_turn_failed_fails_with_its_message() -> None:
    events, _ = run(
        message("item_0", "trying"), {"type": "turn.failed", "error": {"message": "quota exceeded"}}
    )
    with pytest.raises(CodexError, match="Codex: quota exceeded"):
        events.outcome(1)


def test_a_top_level_error_fails_unless_the_turn_completes() -> None:
    events, _ = run({"type": "error", "message": "stream disconnected"})
    with pytest.raises(CodexError, match="stream disconnected"):
        events.outcome(1)
    events, _ = run(
        {"type": "error", "message": "Reconnecting... 1/5"},
        message("i", "ok"),
        {"type": "turn.completed", "usage": {}},
    )
    assert events.outcome(0) == "ok"


def test_an_exit_before_the_turn_completed_fails_with_stderr() -> None:
    events, _ = run({"type": "thread.started", "thread_id": "t"}, {"type": "turn.started"})
    with pytest.raises(
        CodexError, match=r"exited with code 1 before the turn completed: .*Error: no credentials"
    ):
        events.outcome(1, "starting\nError: no credentials\n\nStack backtrace:\n   0: <unknown>")


def test_the_command_line_of_a_first_and_a_later_turn() -> None:
    provider = CodexProvider({"executable": "/bin/true", "model": "gpt-x", "extra_args": ["--oss"]})
    first = provider.command(None, "http://127.0.0.1:9/mcp")
    assert first == [
        "/bin/true",
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--sandbox",
        "workspace-write",
        "--model",
        "gpt-x",
        "-c",
        'shell_environment_policy.exclude=["CODEX_API_KEY", "TETHER_MCP_TOKEN"]',
        "-c",
        'mcp_servers.tether.url="http://127.0.0.1:9/mcp"',
        "-c",
        'mcp_servers.tether.bearer_token_env_var="TETHER_MCP_TOKEN"',
        "-c",
        "mcp_servers.tether.required=true",
        "-c",
        'mcp_servers.tether.default_tools_approval_mode="approve"',
        "--oss",
        "-",
    ]
    assert provider.command("sess-1", "http://127.0.0.1:9/mcp") == [*first[:-1], "resume", "sess-1", "-"]
    with_model = provider.command(None, None, "gpt-own")
    assert with_model[with_model.index("--model") + 1] == "gpt-own"  # the thread's model wins


def test_the_default_model_and_the_secrets_kept_from_the_shell() -> None:
    provider = CodexProvider({"executable": "/bin/true", "api_key_env": "MY_CODEX_CRED"})
    argv = provider.command(None, None)
    assert argv[argv.index("--model") + 1] == DEFAULT_MODEL
    assert 'shell_environment_policy.exclude=["CODEX_API_KEY", "MY_CODEX_CRED", "TETHER_MCP_TOKEN"]' in argv
    assert not [a for a in argv if a.startswith("mcp_servers")]  # no environment URL: no server


def test_a_turns_usage_is_the_growth_of_the_sessions_total() -> None:
    """``turn.completed.usage`` counts the whole session (checked with the real CLI in
    tests/integration/test_codex_real.py)."""
    first = {"input_tokens": 170, "output_tokens": 7, "cached_input_tokens": 0}
    second = {"input_tokens": 500, "output_tokens": 21, "cached_input_tokens": 0}
    assert turn_usage(first, None) == first
    assert turn_usage(second, first) == {"input_tokens": 330, "output_tokens": 14, "cached_input_tokens": 0}


def test_check_says_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TETHER_UNIT_CODEX_KEY", raising=False)
    missing = CodexProvider({"executable": "/no/such/codex"}).check() or ""
    assert "not found" in missing and INSTALL in missing and "@openai/codex@0.169.0" in INSTALL
    provider = CodexProvider({"executable": "/bin/true", "api_key_env": "TETHER_UNIT_CODEX_KEY"})
    assert provider.check() == "no API key: the environment variable TETHER_UNIT_CODEX_KEY is not set"
    monkeypatch.setenv("TETHER_UNIT_CODEX_KEY", "sk-1")
    assert provider.check() is None


async def test_a_leftover_codex_is_ended_and_a_reused_pid_is_not() -> None:
    """``end_leftover`` ends the process group it recorded, and leaves alone a pid whose
    process is another one now (another start time)."""
    leftover = subprocess.Popen(["sleep", "30"], start_new_session=True)
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        await end_leftover({"pid": other.pid, "start": _started(other.pid) - 1})  # a reused pid
        await end_leftover({"pid": leftover.pid, "start": _started(leftover.pid)})
        assert leftover.wait(5) == -signal.SIGKILL
        assert other.poll() is None
    finally:
        for process in (leftover, other):
            process.kill()
            process.wait()
