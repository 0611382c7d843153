"""The ``claude`` provider: a thread's runs as turns of its Claude Code session, sessions
resumed after a restart, and a CLI that outlived tether adopted — see
:mod:`tether.providers.claude`."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from tether.domain.records import Item, Thread
from tether.engine.processes import process_start_time
from tether.private import write_private
from tether.providers.base import Services, Turn
from tether.providers.claude.cli import INSTALL, SHIM, bundled_cli, load_sdk, version_problem
from tether.providers.claude.session import LOST, NOTIFICATION_END, ClaudeError, ClaudeSession, exit_code
from tether.providers.claude.transcript import WrittenTurn, process_exit, written_turns

log = logging.getLogger(__name__)

#: Runs that a CLI-run item's end queues: they take the CLI's self-started turn.
WAKE_TRIGGERS = {"background_command", "monitor_event", "monitor_finished"}
_PROMPTED = {"user", "task", "message"}

SYSTEM_PROMPT = (
    "You run inside tether, as one agent thread (id {thread_id}). Long work (test suites, builds) "
    "may run in the background: end your turn once it runs; its finish wakes you for a new turn. "
    "tether's tools are on the MCP server 'tether': delegate work to other agent threads with "
    "delegate_task; their answers come back to you as new turns, so never poll for them."
)


class ClaudeProvider:
    """Config (``[providers.claude]``): ``cli_path`` (default ``claude``), ``model``,
    ``permission_mode`` (default ``bypassPermissions``: nobody is there to approve a tool),
    ``allowed_tools`` (default ``["mcp__tether"]``), ``append_system_prompt``,
    ``wake_grace_s`` (how long a wake run waits for the CLI's own turn when the CLI does not
    report its session state; default 10), ``notification_grace_s`` (how long a final
    ``task_updated`` waits for a ``task_notification``; default 0.5), ``credential_ttl_s``
    (default 7 days)."""

    name = "claude"

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        config = config or {}
        self.cli_path: str | None = config.get("cli_path") or None
        #: The variable holding the model service's API key ("" leaves the key as it is).
        self.api_key_env: str | None = config.get("api_key_env", "ANTHROPIC_API_KEY")
        self._runs: dict[str, str | None] = {}  # executable -> why it does not run (None: it does)
        self.model: str | None = config.get("model")
        self.permission_mode: str | None = config.get("permission_mode", "bypassPermissions")
        self.allowed_tools = [str(t) for t in config.get("allowed_tools", ["mcp__tether"])]
        self.append_system_prompt: str | None = config.get("append_system_prompt")
        self.wake_grace_s = float(config.get("wake_grace_s", 10.0))
        self.notification_grace_s = float(config.get("notification_grace_s", 0.5))
        self.credential_ttl_s = int(config.get("credential_ttl_s", 7 * 24 * 3600))
        self._sessions: dict[str, ClaudeSession] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        self._adopted: set[asyncio.Task[None]] = set()

    def executable(self) -> str | None:
        """The configured ``cli_path``; without one, the CLI the SDK's wheel bundles, else
        ``claude`` on the PATH."""
        if self.cli_path is None:
            return bundled_cli() or shutil.which("claude")
        path = Path(self.cli_path).expanduser()
        if os.sep in self.cli_path:
            return str(path) if path.is_file() and os.access(path, os.X_OK) else None
        return shutil.which(self.cli_path)

    def diagnose(self) -> str | None:
        """``check()``, and that the executable runs (``--version``, once per executable):
        what ``tether providers`` shows. Not on the way of every thread: it starts a process."""
        executable = self.executable()
        if self.check() is None and executable is not None and executable not in self._runs:
            self._runs[executable] = version_problem(executable)
        return self.check() or self._runs.get(executable or "")

    def check(self) -> str | None:
        """What can be checked at once: the SDK, the executable, and that it will accept the
        permission mode (as root, bypassPermissions needs IS_SANDBOX)."""
        if importlib.util.find_spec("claude_agent_sdk") is None:
            return f"the claude-agent-sdk package is not installed: {INSTALL}"
        if self.executable() is None:
            where = repr(self.cli_path) if self.cli_path else "claude (bundled or on the PATH)"
            return f"Claude Code {where} not found (set cli_path in [providers.claude], or {INSTALL})"
        if (
            self.permission_mode == "bypassPermissions"
            and hasattr(os, "geteuid")
            and os.geteuid() == 0
            and os.environ.get("IS_SANDBOX", "").lower() not in ("1", "true")
        ):
            return "as root, Claude Code refuses permission_mode bypassPermissions unless IS_SANDBOX=1"
        return None

    async def close(self) -> None:
        for task in list(self._adopted):
            task.cancel()
        sessions, self._sessions = list(self._sessions.values()), {}
        await asyncio.gather(*(s.close() for s in sessions), *self._adopted, return_exceptions=True)

    # ------------------------------------------------------------------ after a restart

    def adopt(self, services: Services, items: list[Item]) -> None:
        """After a restart: background work of Claude Code sessions tether no longer reads.
        Their CLI lived on (see ``SHIM``); once it exits, each item ends as its transcript
        says — and its wake run takes the turn the CLI wrote (``_written``) — or as lost."""
        by_thread: dict[str, list[Item]] = {}
        for item in items:
            by_thread.setdefault(item.thread_id, []).append(item)
        for thread_id, its in by_thread.items():
            task = asyncio.get_running_loop().create_task(
                self._follow(services, thread_id, its), name=f"claude orphan of {thread_id}"
            )
            self._adopted.add(task)
            task.add_done_callback(self._adopted.discard)

    async def _follow(self, services: Services, thread_id: str, items: list[Item]) -> None:
        written: dict[str, WrittenTurn] = {}
        try:
            with services.view() as u:
                thread = u.load(Thread, thread_id)
            saved = (thread.state.get("claude") or {}) if thread is not None else {}
            if saved.get("pid"):
                await process_exit(int(saved["pid"]), saved.get("pidStart"))
            written = await self._transcript(saved.get("sessionId"), services.workspace)
        except asyncio.CancelledError:
            raise
        except Exception:  # never leave the items open: they end as lost below
            log.exception("claude thread %s: could not follow its orphaned session", thread_id)
        for item in items:
            end = written.get(item.label or "")
            try:
                if end is None:
                    services.commands.process_ended(item.id, None, reason=LOST)
                else:
                    code, reason = exit_code(end.summary), NOTIFICATION_END.get(end.status, "failed")
                    services.commands.process_ended(item.id, code, reason=reason, tail=end.summary)
            except Exception:
                log.exception("claude thread %s: could not end item %s", thread_id, item.id)

    @staticmethod
    async def _transcript(session_id: str | None, workspace: Path) -> dict[str, WrittenTurn]:
        if not session_id:
            return {}
        load_sdk()
        messages = await asyncio.to_thread(load_sdk().get_session_messages, session_id, str(workspace))
        return written_turns(messages)

    async def _written(self, turn: Turn, item_id: str | None) -> WrittenTurn | None:
        """The wake turn Claude Code wrote for ``item_id``'s end while tether was down."""
        if not item_id:
            return None
        with turn.services.view() as u:
            item = u.load(Item, item_id)
        if item is None or item.runner != self.name or not item.label:
            return None
        session_id = (turn.thread.state.get("claude") or {}).get("sessionId")
        found = (await self._transcript(session_id, turn.workspace)).get(item.label)
        return found if found is not None and found.complete else None

    # ------------------------------------------------------------------ turns

    async def run_turn(self, turn: Turn) -> str | None:
        kind = str(turn.run.trigger.get("kind"))
        item_id = turn.run.trigger.get("key")
        live = self._sessions.get(turn.thread.id)
        ends = kind in WAKE_TRIGGERS and kind != "monitor_event"  # an item's end, not its output
        if ends and not (live is not None and live.owns(item_id)):
            written = await self._written(turn, item_id)
            if written is not None:
                for text in written.texts:
                    turn.say(text)
                return written.texts[-1] if written.texts else None
        session = await self._session(turn)
        if kind == "monitor_event" and session.owns(item_id):
            claimed = session.events(str(item_id), turn.run.id)
            if not claimed:
                return None  # its turns went to the monitor's finish run
        elif kind in WAKE_TRIGGERS and session.owns(item_id):
            claimed = await session.wake(item_id, turn.run.id, self.wake_grace_s)
            if not claimed:
                self._remember(turn, session)
                return session.last_reply
        else:
            claimed = await session.prompt(self._prompt(turn, kind), turn.run.id)
        self._remember(turn, session)
        reply: str | None = None
        for cli_turn in claimed:
            for text in cli_turn.texts:
                turn.say(text)
            reply = cli_turn.reply if cli_turn.reply is not None else reply
        error = claimed[-1].error
        if error:
            raise ClaudeError(f"Claude Code: {error}")
        return reply

    @staticmethod
    def _prompt(turn: Turn, kind: str) -> str:
        if kind in _PROMPTED:
            return turn.text
        return f"[tether: {kind.replace('_', ' ')}]\n{turn.text}"

    @staticmethod
    def _remember(turn: Turn, session: ClaudeSession) -> None:
        saved = dict(turn.thread.state.get("claude") or {})
        if session.session_id and saved.get("sessionId") != session.session_id:
            turn.save_state({**turn.thread.state, "claude": {**saved, "sessionId": session.session_id}})

    # ------------------------------------------------------------------ sessions

    async def _session(self, turn: Turn) -> ClaudeSession:
        thread_id = turn.thread.id
        lock = self._opening.setdefault(thread_id, asyncio.Lock())
        async with lock:
            session = self._sessions.get(thread_id)
            if session is not None and not session.dead:
                return session
            if session is not None:
                await session.close()
            resume = (turn.thread.state.get("claude") or {}).get("sessionId")
            try:
                session = await self._open(turn, resume)
            except ClaudeError as exc:
                if not resume:
                    raise
                log.warning(
                    "claude thread %s: resuming %s failed (%s); starting afresh", thread_id, resume, exc
                )
                session = await self._open(turn, None)
            self._sessions[thread_id] = session
            return session

    async def _open(self, turn: Turn, resume: str | None) -> ClaudeSession:
        session = ClaudeSession(
            turn.thread.id, turn.services.commands, self.notification_grace_s, Path(turn.workspace)
        )
        append = SYSTEM_PROMPT.format(thread_id=turn.thread.id)
        if self.append_system_prompt:
            append += "\n\n" + self.append_system_prompt
        cli_dir = self._cli_dir(turn)
        env = {"CLAUDE_CODE_EMIT_SESSION_STATE_EVENTS": "1", "TETHER_THREAD_ID": turn.thread.id}
        settings = self._key_helper(cli_dir, env)
        cli_path = self.executable() or self.cli_path or "claude"
        pidfile = None
        if cli_dir is not None:
            pidfile = cli_dir / f"{turn.thread.id}.pid"
            pidfile.unlink(missing_ok=True)
            env.update(TETHER_CLAUDE_CLI=cli_path, TETHER_CLAUDE_PIDFILE=str(pidfile))
            cli_path = str(self._shim(cli_dir))
        mcp_config = self._mcp_config(turn)
        options = load_sdk().ClaudeAgentOptions(
            cli_path=cli_path,
            cwd=str(turn.workspace),
            model=self.model,
            permission_mode=self.permission_mode,
            allowed_tools=self.allowed_tools,
            system_prompt={"type": "preset", "preset": "claude_code", "append": append},
            resume=resume,
            mcp_servers=mcp_config or {},
            env=env,
            settings=settings,
            stderr=session.on_stderr,
        )
        client = load_sdk().ClaudeSDKClient(options)
        try:
            await client.connect()
        except Exception as exc:
            raise ClaudeError(await session.start_failure(exc)) from exc
        session.client = client
        session.session_id = resume
        if mcp_config is not None:
            Path(mcp_config).unlink(missing_ok=True)  # read: the agent's commands find no credential
        if pidfile is not None:
            self._remember_cli(turn, pidfile)
        session.reader = asyncio.get_running_loop().create_task(
            session.read(client.receive_messages()), name=f"claude {turn.thread.id}"
        )
        return session

    def _cli_dir(self, turn: Turn) -> Path | None:
        """Where this environment keeps the shim, the pid files and MCP configs."""
        return turn.services.provider_dir(self.name)

    @staticmethod
    def _shim(directory: Path) -> Path:
        path = directory / "claude-shim"
        body = SHIM.format(python=sys.executable)
        if not path.exists() or path.read_text() != body:
            fd = os.open(f"{path}.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700)
            with os.fdopen(fd, "w") as handle:
                handle.write(body)
            os.replace(f"{path}.tmp", path)
        return path

    def _key_helper(self, directory: Path | None, env: dict[str, str]) -> str | None:
        """Keep the API key out of the environment of the agent's commands (they inherit the
        CLI's): the CLI gets it from an ``apiKeyHelper`` reading a file only tether's user
        can read, and an empty ``ANTHROPIC_API_KEY``. None (the key stays in the
        environment) when there is no key, or nowhere to keep it."""
        key = os.environ.get(self.api_key_env or "")
        if not key or directory is None:
            return None
        path = directory / "api-key"
        fd = os.open(f"{path}.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(key)
        os.replace(f"{path}.tmp", path)
        env["ANTHROPIC_API_KEY"] = ""
        if self.api_key_env != "ANTHROPIC_API_KEY":
            env[str(self.api_key_env)] = ""
        return json.dumps({"apiKeyHelper": f"cat {shlex.quote(str(path))}"})

    @staticmethod
    def _remember_cli(turn: Turn, pidfile: Path) -> None:
        """Keep the CLI's pid (and start time) in the thread: after a restart, tether knows
        which process still runs the session's background work."""
        try:
            pid = int(pidfile.read_text())
        except (OSError, ValueError):
            return
        saved = dict(turn.thread.state.get("claude") or {})
        saved.update(pid=pid, pidStart=process_start_time(pid))
        turn.save_state({**turn.thread.state, "claude": saved})

    def _mcp_config(self, turn: Turn) -> str | None:
        """A ``--mcp-config`` file (mode 0600) naming tether's ``/mcp`` with a fresh
        credential of this thread; None when this environment's URL is not known."""
        directory, credentials = turn.services.provider_dir(self.name), turn.services.credentials
        label = f"claude session of {turn.thread.id}"
        minted = (
            credentials.thread_credential(turn.thread.id, label, self.credential_ttl_s)
            if credentials and directory
            else None
        )
        if directory is None or minted is None:
            log.warning(
                "claude thread %s: no base URL known; the session gets no tether tools", turn.thread.id
            )
            return None
        url, token = minted
        path = directory / f"{turn.thread.id}.mcp.json"
        body = {
            "mcpServers": {
                "tether": {
                    "type": "http",
                    "url": url,
                    "headers": {"Authorization": f"Bearer {token}"},
                }
            }
        }
        write_private(path, json.dumps(body))
        return str(path)
