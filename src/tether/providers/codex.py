"""The ``codex`` provider: each turn is one ``codex exec --json`` process.

The first turn runs ``codex exec --json ... -`` (the prompt on stdin) in the workspace;
``thread.started {thread_id}`` gives the session id, kept in the thread's state
(``{"codex": {"sessionId": ...}}``), and later turns run ``codex exec --json ... resume
<SESSION_ID> -`` with every flag given again. The API key comes from the environment
variable named by ``api_key_env`` and reaches Codex as ``CODEX_API_KEY``.

The JSON lines are read as they come: an ``agent_message`` item, once completed, is said
(the last one is the run's reply); ``command_execution``, ``mcp_tool_call`` and the other
items are tool activity, logged; ``turn.completed`` ends the turn; ``turn.failed`` fails
the run with its message, and so does a top-level ``error`` unless the turn still
completes (Codex reports transient stream errors, such as reconnects, that way).

Codex has no wake of its own: a later turn is always started by tether. Background work
goes through tether's tools — the session gets tether's MCP server (``/mcp`` of this
environment) by ``-c mcp_servers.tether.url=...`` and a per-thread credential passed in an
environment variable (``bearer_token_env_var``), never on the command line — so a
``monitor_start`` or ``schedule_wake`` wakes the thread with a new turn as usual. Tether's
server is ``required`` (a failed handshake fails the turn rather than running it without
tools) and its tools are approved in advance (``default_tools_approval_mode``): ``codex
exec`` never asks, so a tool that needs approval would be refused. The credential and the
API key are kept out of the shell commands the model runs (``shell_environment_policy``).

``turn.completed.usage`` counts the whole session so far: the session's total is kept in
the thread's state and a turn's own usage is the difference. Items can come before
``turn.started``; notices come as ``error`` items (an unknown model's fallback) or as
top-level ``error`` events (reconnects): logged, never fatal by themselves.

The process group of each turn's ``codex exec`` is kept in the thread's state too: a SIGKILL
of tether leaves it running with no reader, and the next turn (the ``restart`` run) ends
it before resuming the session, so no two Codex processes ever share one.

Checked against ``@openai/codex`` 0.169.0 (tests/agents/package.json; docs/agents.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from tether.providers.base import Turn

log = logging.getLogger(__name__)

_PROMPTED = {"user", "task", "message"}
_TOKEN_ENV = "TETHER_MCP_TOKEN"
#: A model of the pinned CLI's catalog (``codex debug models``) that offers tools as functions.
DEFAULT_MODEL = "gpt-5.5"
#: What ``tether providers`` tells to run when the executable is missing.
INSTALL = "npm install -g @openai/codex@0.169.0"


class CodexError(Exception):
    """The turn failed; the message says why (Codex's own words where it gave them)."""


class CodexEvents:
    """The events of one ``codex exec --json`` run, read one by one.

    ``feed`` returns the texts to say now; ``outcome`` gives the run's reply or raises.
    """

    def __init__(self) -> None:
        self.thread_id: str | None = None
        self.completed = False
        self.failure: str | None = None
        self.errors: list[str] = []
        self.reply: str | None = None
        self.usage: dict[str, Any] | None = None
        self._said: set[str] = set()
        self._partial: dict[str, str] = {}

    def feed(self, event: dict[str, Any]) -> list[str]:
        kind = event.get("type")
        if kind == "thread.started":
            self.thread_id = event.get("thread_id") or self.thread_id
        elif kind in ("item.started", "item.updated", "item.completed"):
            return self._item(kind, event.get("item") or {})
        elif kind == "turn.completed":
            self.completed = True
            self.usage = event.get("usage")
        elif kind == "turn.failed":
            self.failure = str((event.get("error") or {}).get("message") or "the turn failed")
        elif kind == "error":
            self.errors.append(str(event.get("message") or "error"))
        return []

    def _item(self, kind: str, item: dict[str, Any]) -> list[str]:
        item_id, item_type = str(item.get("id", "")), item.get("type")
        if item_type == "agent_message":
            text = item.get("text") or ""
            if kind != "item.completed":
                self._partial[item_id] = text
                return []
            self._partial.pop(item_id, None)
            if not text or item_id in self._said:
                return []
            self._said.add(item_id)
            self.reply = text
            return [text]
        if kind != "item.completed":
            return []
        if item_type == "command_execution":
            log.info("codex ran `%s` (exit %s)", item.get("command"), item.get("exit_code"))
        elif item_type == "mcp_tool_call":
            log.info("codex called %s.%s: %s", item.get("server"), item.get("tool"), item.get("status"))
        elif item_type == "error":
            log.warning("codex: %s", item.get("message"))
        elif item_type is not None:
            log.debug("codex %s item %s", item_type, item_id)
        return []

    def outcome(self, exit_code: int | None, stderr: str = "") -> str | None:
        if self.failure is not None:
            raise CodexError(f"Codex: {self.failure}")
        if self.completed:
            if self.reply is None and self._partial:
                return list(self._partial.values())[-1] or None
            return self.reply
        if self.errors:
            raise CodexError(f"Codex: {self.errors[-1]}")
        raise CodexError(f"codex exited with code {exit_code} before the turn completed{_reason(stderr)}")


def _reason(stderr: str) -> str:
    """Codex's own reason from its stderr: its last ``Error:`` line (a backtrace may follow),
    else the last lines."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error")]
    picked = errors[-1:] or lines[-3:]
    return f": {' / '.join(picked)[:2000]}" if picked else ""


def turn_usage(total: dict[str, Any] | None, before: dict[str, Any] | None) -> dict[str, int]:
    """One turn's usage: Codex's session total now minus the total after the previous turn."""
    before = before or {}
    return {
        key: int(value) - int(before.get(key) or 0)
        for key, value in (total or {}).items()
        if isinstance(value, int)
    }


class CodexProvider:
    """Config (``[providers.codex]``): ``executable`` (default ``codex``), ``model`` (default
    :data:`DEFAULT_MODEL`), ``api_key_env`` (default ``CODEX_API_KEY``), ``sandbox`` (default
    ``workspace-write``; empty for Codex's own default), ``extra_args`` (more flags for every
    ``codex exec``), ``credential_ttl_s`` (of the MCP credential, default one day)."""

    name = "codex"

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        config = config or {}
        self.executable_name = str(config.get("executable") or "codex")
        self.model = str(config.get("model") or DEFAULT_MODEL)
        self.api_key_env = str(config.get("api_key_env") or "CODEX_API_KEY")
        self.sandbox: str | None = config.get("sandbox", "workspace-write") or None
        self.extra_args = [str(arg) for arg in config.get("extra_args", [])]
        self.credential_ttl_s = int(config.get("credential_ttl_s", 24 * 3600))
        self._credentials: dict[str, tuple[str, str, float]] = {}  # thread -> (mcp url, token, expiry)

    def executable(self) -> str | None:
        path = Path(self.executable_name).expanduser()
        if os.sep in self.executable_name:
            return str(path) if path.is_file() and os.access(path, os.X_OK) else None
        return shutil.which(self.executable_name)

    def check(self) -> str | None:
        if self.executable() is None:
            name = self.executable_name
            return (
                f"Codex executable {name!r} not found: install it with `{INSTALL}` "
                "(or set executable in [providers.codex])"
            )
        if not os.environ.get(self.api_key_env):
            return f"no API key: the environment variable {self.api_key_env} is not set"
        return None

    async def close(self) -> None:
        self._credentials.clear()

    def command(self, session_id: str | None, mcp_url: str | None, model: str | None = None) -> list[str]:
        """The argv of one turn; the prompt goes to stdin (``-``). ``model``: the thread's own
        (a delegated task's ``target.model``), else the configured one."""
        argv = [self.executable() or self.executable_name, "exec", "--json", "--skip-git-repo-check"]
        if self.sandbox:
            argv += ["--sandbox", self.sandbox]
        argv += ["--model", model or self.model]
        secrets = sorted({"CODEX_API_KEY", self.api_key_env, _TOKEN_ENV})
        argv += ["-c", f"shell_environment_policy.exclude={json.dumps(secrets)}"]
        if mcp_url:
            server = {
                "url": mcp_url,
                "bearer_token_env_var": _TOKEN_ENV,
                "required": True,
                "default_tools_approval_mode": "approve",
            }
            for key, value in server.items():
                argv += ["-c", f"mcp_servers.tether.{key}={json.dumps(value)}"]
        argv += self.extra_args
        if session_id:
            argv += ["resume", session_id]
        return [*argv, "-"]

    async def run_turn(self, turn: Turn) -> str | None:
        key = os.environ.get(self.api_key_env)
        if not key:
            raise CodexError(f"no API key: the environment variable {self.api_key_env} is not set")
        state = dict(turn.thread.state.get("codex") or {})
        session_id = state.get("sessionId")
        await end_leftover(state.pop("process", None))
        env = {**os.environ, "CODEX_API_KEY": key}
        mcp_url, token = self._credential(turn)
        if token:
            env[_TOKEN_ENV] = token
        kind = str(turn.run.trigger.get("kind"))
        prompt = turn.text if kind in _PROMPTED else f"[tether: {kind.replace('_', ' ')}]\n{turn.text}"
        process = await asyncio.create_subprocess_exec(
            *self.command(session_id, mcp_url, turn.thread.model),
            cwd=turn.workspace,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            **turn.shell.group_options(),
            limit=16 * 1024 * 1024,
        )
        # its process group, ended by the next turn should it outlive us (a SIGKILL of tether)
        state["process"] = {"pid": process.pid, "start": _started(process.pid)}
        turn.save_state({**turn.thread.state, "codex": state})
        events = CodexEvents()
        stderr: list[str] = []
        drain = asyncio.create_task(_tail(process.stderr, stderr))
        try:
            assert process.stdin is not None and process.stdout is not None
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                process.stdin.write(prompt.encode())
                await process.stdin.drain()
            process.stdin.close()
            async for raw in process.stdout:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("{"):
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    log.warning("codex printed a line that is not JSON: %s", line[:200])
                    continue
                for text in events.feed(event):
                    turn.say(text)
                if events.thread_id and events.thread_id != session_id:
                    session_id = events.thread_id
                    fresh = {k: v for k, v in state.items() if k != "usage"}  # a new session's total
                    turn.save_state({**turn.thread.state, "codex": {**fresh, "sessionId": session_id}})
            code = await process.wait()
            await drain
            self._ended(turn, events.usage if events.completed else None)
        finally:
            if process.returncode is None:
                turn.shell.kill_tree(process.pid)
                with contextlib.suppress(Exception):
                    await asyncio.shield(process.wait())
            drain.cancel()
        return events.outcome(code, "\n".join(stderr))

    def _ended(self, turn: Turn, total: dict[str, Any] | None) -> None:
        """The process has ended: forget it; keep the session's usage total (when the turn
        completed) and log this turn's share."""
        codex = dict(turn.thread.state.get("codex") or {})
        codex.pop("process", None)
        if total:
            log.info("codex turn of %s used %s", turn.thread.id, turn_usage(total, codex.get("usage")))
            codex["usage"] = total
        turn.save_state({**turn.thread.state, "codex": codex})

    def _credential(self, turn: Turn) -> tuple[str | None, str | None]:
        """``(mcp url, token)`` of this thread (minted once, renewed before it expires)."""
        credentials = turn.services.credentials
        cached = self._credentials.get(turn.thread.id)
        if cached is None or cached[2] - time.monotonic() < self.credential_ttl_s / 4:
            minted = credentials and credentials.thread_credential(
                turn.thread.id, f"codex session of {turn.thread.id}", self.credential_ttl_s
            )
            if not minted:
                return None, None
            cached = (*minted, time.monotonic() + self.credential_ttl_s)
            self._credentials[turn.thread.id] = cached
        return cached[0], cached[1]


async def end_leftover(process: dict[str, Any] | None) -> None:
    """End the process group of an earlier turn's ``codex exec`` that outlived tether (a
    SIGKILL of tether leaves it running, with no one to read its answer), so that no two
    Codex processes ever work on one session: this turn resumes it alone. ``process`` is
    ``{pid, start}``: a pid now used by another process (another start time) is left alone."""
    process = process or {}
    pgid, start = int(process.get("pid") or 0), process.get("start")
    if not pgid or start is None or _started(pgid) != start:  # gone, or the pid is another's now
        return
    log.warning("ending codex process group %s, left over from before a restart", pgid)
    try:
        exited = _exit_of(pgid)
    except ProcessLookupError:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    await asyncio.wait_for(exited, 10)


def _started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot; Linux), None if it is gone or
    this is not Linux: with the pid, it names one process for good."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _exit_of(pid: int) -> asyncio.Future[None]:
    """A future done when process ``pid`` (not our child: tether restarted) has exited."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    fd = os.pidfd_open(pid)

    def ended() -> None:
        loop.remove_reader(fd)
        os.close(fd)
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, ended)
    return done


async def _tail(stream: asyncio.StreamReader | None, into: list[str]) -> None:
    if stream is None:
        return
    async for raw in stream:
        into.append(raw.decode("utf-8", "replace").rstrip())
        del into[:-20]
