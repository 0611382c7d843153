"""The ``claude`` provider: Claude Code, driven through the Claude Agent SDK.

Each thread keeps **one live SDK session** — one Claude Code process — from its first run
until tether shuts down. It is never closed at a ``ResultMessage``: closing kills the CLI
and the background work it runs, whose finish notices then never come (the known trap).
A restarted tether resumes the conversation from the session id kept in the thread's
state (``{"claude": {"sessionId": ...}}``).

Claude Code runs background work itself (background Bash, Monitor). tether mirrors it so
that the thread's task does not settle around it, and so that its end wakes the thread:

- ``task_started`` (a background shell or monitor) → a background item tether does not
  spawn (``start_process(..., spawn=False)``), labelled with the CLI's task id;
- its end — a ``task_notification`` (completed | failed | stopped), or a ``task_updated``
  reaching completed | failed | killed when no notification comes — → ``process_ended``,
  exactly once per task: the item ends and its wake run is queued in one transaction (G2).

Claude Code meanwhile starts its own turn for that end (``ResultMessage.origin.kind ==
"task-notification"``). When tether runs the wake run, the provider sends no prompt: the
run takes that self-started turn's output (its text, said as the run's messages, and its
result, the run's reply). One reader per session reads every message, between runs too,
and splits them into turns, which runs then claim:

- a prompted run (user, task, message, and wakes of work tether runs itself) sends its
  text with a fresh uuid and claims the turn whose result lists that uuid — skipping the
  CLI's own turns, which stay for their wake runs (a wake can arrive while a user message
  is queued: tether runs that message first, the CLI its own turn first);
- a wake run claims the CLI's own turns not yet claimed, oldest first, until the CLI says
  it is ``idle`` after the task's end (turns of monitor events no run asked for come along);
  if it says so with no such turn — the notice went into a turn that was running — the run
  claims none and repeats the latest reply, so that the answer stays the last reply. A CLI
  that reports no session state gets ``wake_grace_s`` to begin its turn.

Not mirrored: a foreground Bash the CLI reports as a task (``is_backgrounded: false``) and
work a subagent started (``owned_by_subagent``); a background subagent is an ``agent`` item.
A Monitor's events are turns the CLI starts itself whose monitor and lines only the
transcript names: they become the monitor's output, and its ``monitor_event`` runs take them.

After a stop of tether the CLI lives on (it runs under ``SHIM``) while it has background
work; on start, ``adopt`` waits for it to exit and ends its items as its transcript says,
and each wake run takes the turn the CLI wrote (``claude_transcript``).

A user message that arrives while a wake is pending queues behind it: tether runs one run
at a time per thread, and the prompt is sent only when its run starts.

Every session gets tether's MCP server (``/mcp`` of this environment) with a per-thread
credential minted here, in a ``--mcp-config`` file readable by tether's user only.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tether.domain.records import Item, Thread
from tether.engine.processes import process_start_time
from tether.private import write_private
from tether.providers.base import Turn
from tether.providers.claude_transcript import WrittenTurn, event_notice, process_exit, written_turns
from tether.types import Caller

log = logging.getLogger(__name__)

#: ``claude_agent_sdk``, imported with the first session (it is slow to import, and
#: ``tether providers`` or a server without claude threads need not pay for it).
sdk: Any = None


def _load_sdk() -> Any:
    global sdk
    if sdk is None:
        import claude_agent_sdk

        sdk = claude_agent_sdk
    return sdk


#: Claude Code task types tether mirrors as background items, and their item kind (the
#: real CLI reports a Monitor as ``local_bash`` too: its tool's name tells). Other
#: background work the CLI wakes its agent for (a subagent, ...) is an ``agent`` item.
TASK_KINDS = {"local_bash": "command", "monitor": "monitor", "local_agent": "agent"}
#: A final status → the ``reason`` given to ``process_ended`` (None: ended normally).
NOTIFICATION_END = {"completed": None, "failed": "failed", "stopped": "stopped"}
UPDATED_END = {"completed": None, "failed": "failed", "killed": "stopped"}
#: Runs that a CLI-run item's end queues: they take the CLI's self-started turn.
WAKE_TRIGGERS = {"background_command", "monitor_event", "monitor_finished"}
_EXIT_CODE = re.compile(r"exit code:?\s*(-?\d+)", re.IGNORECASE)
_PROMPTED = {"user", "task", "message"}
LOST = "lost: the Claude Code session ended"

SYSTEM_PROMPT = (
    "You run inside tether, as one agent thread (id {thread_id}). Long work (test suites, builds) "
    "may run in the background: end your turn once it runs; its finish wakes you for a new turn. "
    "tether's tools are on the MCP server 'tether': delegate work to other agent threads with "
    "delegate_task; their answers come back to you as new turns, so never poll for them."
)


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
def _exit_code(summary: str | None, code: Any = None) -> int | None:
    if code is None and summary:
        found = _EXIT_CODE.search(summary)
        code = int(found.group(1)) if found else None
    return int(code) if isinstance(code, int | str) and str(code).lstrip("-").isdigit() else None


INSTALL = "pip install 'tether[claude]'"


def bundled_cli() -> str | None:
    """The Claude Code executable inside the installed ``claude-agent-sdk`` wheel."""
    spec = importlib.util.find_spec("claude_agent_sdk")
    for root in (spec.submodule_search_locations or []) if spec else []:
        found = Path(root) / "_bundled" / "claude"
        if found.is_file() and os.access(found, os.X_OK):
            return str(found)
    return None


def _version_problem(executable: str) -> str | None:
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


class ClaudeError(Exception):
    """A Claude Code turn ended in an error, or the session broke."""


@dataclass
class CliTurn:
    """One turn of the CLI, as read: its messages, then its result."""

    seq: int
    messages: list[Any] = field(default_factory=list)
    result: Any = None
    owner: str | None = None
    #: The monitor item whose event this (self-started) turn reacted to, once known.
    event_of: str | None = None

    @property
    def done(self) -> bool:
        return self.result is not None

    @property
    def origin_kind(self) -> str | None:
        origin = getattr(self.result, "origin", None) or {}
        return origin.get("kind") if isinstance(origin, dict) else None

    @property
    def uuids(self) -> list[str]:
        result = self.result
        found = list(getattr(result, "user_message_uuids", None) or [])
        single = getattr(result, "user_message_uuid", None)
        if single and single not in found:
            found.append(single)
        return found

    @property
    def self_started(self) -> bool:
        return self.done and not self.uuids and self.origin_kind not in (None, "human")

    @property
    def monitor_event(self) -> bool:
        """A turn the CLI started for a monitor's event: a task notification that names no
        task run (the one for a task's end does)."""
        origin = getattr(self.result, "origin", None) or {}
        return self.self_started and self.origin_kind == "task-notification" and not origin.get("runId")

    def answers(self, prompt_uuid: str, sent_seq: int) -> bool:
        """This turn took in the prompt sent with ``prompt_uuid`` (at ``sent_seq``)."""
        if not self.done:
            return False
        if self.uuids:
            return prompt_uuid in self.uuids
        # A CLI that reports no uuids: the first human turn begun after the prompt was sent.
        return self.seq > sent_seq and self.origin_kind in (None, "human")

    @property
    def texts(self) -> list[str]:
        found = []
        for message in self.messages:
            if isinstance(message, sdk.AssistantMessage) and message.parent_tool_use_id is None:
                found.extend(b.text for b in message.content if isinstance(b, sdk.TextBlock) and b.text)
        return found

    @property
    def reply(self) -> str | None:
        text = getattr(self.result, "result", None)
        if isinstance(text, str) and text.strip():
            return text
        texts = self.texts
        return texts[-1] if texts else None

    @property
    def error(self) -> str | None:
        result = self.result
        if result is None or not getattr(result, "is_error", False):
            return None
        errors = [str(e) for e in (getattr(result, "errors", None) or []) if e]
        return "; ".join(errors) or getattr(result, "result", None) or result.subtype or "error"


class ClaudeSession:
    """One thread's live Claude Code session: the reader of its messages, the mirror of its
    background tasks, and the matching of its turns to tether's runs.

    ``handle`` takes one SDK message; it is synchronous and free of I/O but for the
    ``commands`` it calls, so the mapping can be tested without a CLI.
    """

    def __init__(
        self, thread_id: str, commands: Any, notification_grace: float = 0.5, workspace: Path | None = None
    ) -> None:
        _load_sdk()
        self.thread_id = thread_id
        self.commands = commands
        self.workspace = workspace
        self.foreground: set[str] = set()  # CLI task ids of foreground commands (no items)
        self.chores: set[asyncio.Task[None]] = set()
        #: How long a final ``task_updated`` waits for the ``task_notification`` that may
        #: follow it (which says more: a summary, an exit code) before it ends the item.
        self.notification_grace = notification_grace
        self.pending_ends: dict[str, asyncio.TimerHandle] = {}
        self.client: Any = None
        self.reader: asyncio.Task[None] | None = None
        self.seq = 0
        self.turns: list[CliTurn] = []  # not yet claimed, oldest first (the last may be in progress)
        self.current: CliTurn | None = None
        self.state: str | None = None  # the CLI's session state, when it reports one
        self.idle_seq = 0  # seq of the latest "idle"
        self.tasks: dict[str, str] = {}  # CLI task id -> item id
        self.ended: set[str] = set()  # CLI task ids whose end was reported
        self.end_seq: dict[str, int] = {}  # item id -> seq of its end
        self.tool_uses: dict[str, tuple[str, dict[str, Any]]] = {}
        self.abandoned: set[str] = set()  # prompt uuids of cancelled runs
        self.session_id: str | None = None
        self.last_reply: str | None = None
        self.error: str | None = None
        self.dead = False
        self.closing = False
        self.stderr: list[str] = []
        self._changed = asyncio.Event()

    # ------------------------------------------------------------------ reading

    def on_stderr(self, line: str) -> None:
        self.stderr = [*self.stderr[-49:], line[-500:]]

    async def start_failure(self, exc: Exception) -> str:
        """Why the CLI did not start: the SDK says only "Command failed with exit code 1";
        the CLI's own reason is on its stderr, whose last lines may still be on their way."""
        for _ in range(20):
            if self.stderr:
                break
            await asyncio.sleep(0.05)  # the SDK's stderr reader runs beside connect()
        reason = "; ".join(self.stderr[-5:])
        return f"could not start Claude Code: {exc}" + (f": {reason}" if reason else "")

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def until(self, ready: Callable[[], Any], timeout: float | None = None) -> Any:
        """Wait until ``ready()`` is truthy (re-checked after every message) or ``timeout``."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            changed = self._changed
            found = ready()
            if found:
                return found
            if self.dead:
                raise ClaudeError(self.error or "Claude Code exited")
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return found
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)

    async def read(self, messages: AsyncIterator[Any]) -> None:
        """The reader: every message of the session, until the CLI exits."""
        try:
            async for message in messages:
                try:
                    self.handle(message)
                except Exception:  # one bad message must not stop the session
                    log.exception("claude thread %s: could not handle %r", self.thread_id, message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.error = f"Claude Code session failed: {exc}"
        finally:
            self.dead = True
            if not self.error:
                tail = "; ".join(self.stderr[-5:])
                self.error = "Claude Code exited" + (f": {tail}" if tail else "")
            if not self.closing:
                self._lose_tasks()
            self._notify()

    def handle(self, message: Any) -> None:
        self.seq += 1
        try:
            self._handle(message)
        finally:
            self._notify()

    def _handle(self, message: Any) -> None:
        if isinstance(message, sdk.TaskStartedMessage):
            self._task_started(message)
        elif isinstance(message, sdk.TaskNotificationMessage):
            if message.status in NOTIFICATION_END:
                self._task_ended(message.task_id, NOTIFICATION_END[message.status], message.summary, None)
        elif isinstance(message, sdk.TaskUpdatedMessage):
            self._task_updated(message)
        elif isinstance(message, sdk.ResultMessage):
            self._result(message)
        elif isinstance(message, sdk.AssistantMessage | sdk.UserMessage):
            self._turn_message(message)
        elif isinstance(message, sdk.SystemMessage):
            self._system(message)

    def _system(self, message: Any) -> None:
        if message.subtype == "session_state_changed":
            self.state = message.data.get("state")
            if self.state == "idle":
                self.idle_seq = self.seq
        elif message.subtype == "init":
            self.session_id = message.data.get("session_id") or self.session_id

    def _turn_message(self, message: Any) -> None:
        if isinstance(message, sdk.AssistantMessage):
            for block in message.content:
                if isinstance(block, sdk.ToolUseBlock):
                    self.tool_uses[block.id] = (block.name, dict(block.input or {}))
                    log.info("claude thread %s: tool %s %s", self.thread_id, block.name, block.input)
        if message.parent_tool_use_id is not None:
            if self.current is not None:  # a subagent's message, inside a turn
                self.current.messages.append(message)
            return
        self._open().messages.append(message)

    def _open(self) -> CliTurn:
        if self.current is None:
            self.current = CliTurn(self.seq)
            self.turns.append(self.current)
        return self.current

    def _result(self, message: Any) -> None:
        turn = self._open()
        turn.result = message
        self.current = None
        self.session_id = message.session_id or self.session_id
        if any(u in self.abandoned for u in turn.uuids):
            turn.owner = "abandoned"  # its run was cancelled: nobody takes it
            if turn in self.turns:
                self.turns.remove(turn)
        if turn.error is None and turn.reply is not None:
            self.last_reply = turn.reply
        if turn.monitor_event and turn.owner is None:
            self._chore(self._monitor_event(turn))

    def _chore(self, work: Any) -> None:
        """Run ``work`` beside the reader; a failure is logged, never lost silently."""
        task = asyncio.get_running_loop().create_task(work, name=f"claude {self.thread_id} chore")
        self.chores.add(task)

        def done(finished: asyncio.Task[None]) -> None:
            self.chores.discard(finished)
            if not finished.cancelled() and finished.exception() is not None:
                log.error("claude thread %s: %s", self.thread_id, finished.exception())

        task.add_done_callback(done)

    async def _monitor_event(self, turn: CliTurn) -> None:
        """A turn for a monitor's event: which monitor and what it printed are only in the
        session's transcript (the stream says neither). Found, the event becomes the
        monitor's output — a ``monitor_event`` progress run, which then takes this turn."""
        first = next((m.uuid for m in turn.messages if isinstance(m, sdk.AssistantMessage) and m.uuid), None)
        if first is None or not self.session_id or self.workspace is None:
            return
        notice = None
        for _ in range(60):  # the CLI writes its transcript a moment after it streams
            messages = await asyncio.to_thread(sdk.get_session_messages, self.session_id, str(self.workspace))
            notice = event_notice(messages, first)
            if notice is not None:
                break
            await asyncio.sleep(0.05)
        item_id = self.tasks.get(notice[0]) if notice else None
        if notice is None or item_id is None or notice[0] in self.ended or turn.owner is not None:
            return  # not attributable: the monitor's finish run takes the turn instead
        turn.event_of = item_id
        self.commands.monitor_output(item_id, notice[1], None)

    def _task_started(self, message: Any) -> None:
        """Background work of the agent's own becomes an item. Not mirrored: work a subagent
        started (the subagent reacts to its end, not the thread) and a foreground command
        (the CLI reports one running ~3 s or more as a task too, but its tool call waits for
        it and no turn of its own follows) — unless it is sent to the background later."""
        if message.task_id in self.tasks or message.data.get("owned_by_subagent"):
            return
        # CLIs before 2.1.3xx say is_backgrounded only of work that is not a shell's
        if not message.data.get("is_backgrounded", message.task_type in ("local_bash", "monitor")):
            self.foreground.add(message.task_id)
            return
        self._mirror(message.task_id, message.task_type, message.tool_use_id, message.description)

    def _mirror(
        self, task_id: str, task_type: str | None, tool_use_id: str | None, about: str | None
    ) -> None:
        name, tool_input = self.tool_uses.get(tool_use_id or "", ("", {}))
        kind = "monitor" if name == "Monitor" else TASK_KINDS.get(task_type or "", "agent")
        command = str(tool_input.get("command") or about or task_id)
        persistent = kind == "monitor" and bool(tool_input.get("persistent"))  # not held (SPEC §1)
        item = self.commands.start_process(
            Caller("thread", thread_id=self.thread_id),
            kind,
            command,
            label=task_id,
            persistent=persistent,
            spawn=False,
        )
        self.tasks[task_id] = item["id"]

    def _task_updated(self, message: Any) -> None:
        patch = message.patch or {}
        if message.task_id in self.foreground and patch.get("is_backgrounded"):
            self.foreground.discard(message.task_id)  # sent to the background after all
            self._mirror(message.task_id, "local_bash", None, patch.get("description"))
        if message.status in UPDATED_END:
            self._task_updated_end(message)

    def _task_updated_end(self, message: Any) -> None:
        """A final status seen only as a patch so far: the end, unless the notification
        comes within the grace (then it ends the item instead, with what it says)."""
        task_id = message.task_id
        if task_id not in self.tasks or task_id in self.ended or task_id in self.pending_ends:
            return
        patch = message.patch or {}
        code = patch.get("exit_code", patch.get("exitCode"))
        summary = patch.get("summary") or patch.get("error")
        end = (task_id, UPDATED_END[message.status], summary, code, self.seq)
        if self.notification_grace <= 0:
            self._task_ended(*end)
            return
        self.pending_ends[task_id] = asyncio.get_running_loop().call_later(
            self.notification_grace, self._late_end, end
        )

    def _late_end(self, end: tuple[Any, ...]) -> None:
        try:
            self._task_ended(*end)
        except Exception:
            log.exception("claude thread %s: could not end task %s", self.thread_id, end[0])
        finally:
            self._notify()

    def _task_ended(
        self, task_id: str, reason: str | None, summary: str | None, code: Any, seq: int | None = None
    ) -> None:
        pending = self.pending_ends.pop(task_id, None)
        if pending is not None:
            pending.cancel()
        item_id = self.tasks.get(task_id)
        if item_id is None or task_id in self.ended:
            return
        self.ended.add(task_id)
        self.end_seq[item_id] = self.seq if seq is None else seq
        self.commands.process_ended(item_id, _exit_code(summary, code), reason=reason, tail=summary or None)

    def _lose_tasks(self) -> None:
        """The CLI is gone, and its background tasks with it: end their items (their wake
        runs then prompt a new session)."""
        for handle in self.pending_ends.values():
            handle.cancel()
        self.pending_ends.clear()
        for task_id, item_id in list(self.tasks.items()):
            if task_id in self.ended:
                continue
            self.ended.add(task_id)
            self.end_seq[item_id] = self.seq
            with contextlib.suppress(Exception):
                self.commands.process_ended(item_id, None, reason=LOST)

    # ------------------------------------------------------------------ runs

    @property
    def busy(self) -> bool:
        """Background work of this session is still running."""
        return any(task_id not in self.ended for task_id in self.tasks)

    def owns(self, item_id: str | None) -> bool:
        """The item is background work of this (live) session."""
        return item_id is not None and item_id in self.tasks.values() and not self.dead

    def _claim(self, turn: CliTurn, run_id: str) -> CliTurn:
        turn.owner = run_id
        self.turns.remove(turn)
        return turn

    async def prompt(self, text: str, run_id: str) -> list[CliTurn]:
        """Send ``text``; the turn that took it in is this run's."""
        if self.dead:
            raise ClaudeError(self.error or "Claude Code exited")
        prompt_uuid = str(uuid.uuid4())
        sent = self.seq
        message = {
            "type": "user",
            "message": {"role": "user", "content": text},
            "parent_tool_use_id": None,
            "uuid": prompt_uuid,
        }

        async def one() -> AsyncIterator[dict[str, Any]]:
            yield message

        try:
            await self.client.query(one())
            found = await self.until(
                lambda: next((t for t in self.turns if t.answers(prompt_uuid, sent)), None)
            )
        except asyncio.CancelledError:
            self.abandoned.add(prompt_uuid)
            for turn in list(self.turns):
                if turn.done and prompt_uuid in turn.uuids:
                    self.turns.remove(turn)
            await self.interrupt()
            raise
        return [self._claim(found, run_id)]

    def events(self, item_id: str, run_id: str) -> list[CliTurn]:
        """A ``monitor_event`` run: the turns the CLI ran for that monitor's events."""
        return [self._claim(t, run_id) for t in list(self.turns) if t.event_of == item_id]

    async def wake(self, item_id: str, run_id: str, grace: float) -> list[CliTurn]:
        """The turns the CLI started itself for the end of ``item_id``: from the oldest not
        yet taken (turns of monitor events no run asked for come first) until the CLI says
        it is ``idle`` after that end — nothing more is owed. Empty when it said so without
        such a turn: the notice was taken in by a turn that was running."""
        end = self.end_seq.get(item_id, 0)

        def ready() -> Any:
            waiting = next((t for t in self.turns if not t.done or t.self_started), None)
            if waiting is not None:
                return waiting
            if self.idle_seq > end and self.current is None:
                return "idle"
            return None

        claimed: list[CliTurn] = []
        while True:
            if claimed and self.state is None:
                # No session-state reports: take what is over already, and no more.
                claimed += [self._claim(t, run_id) for t in list(self.turns) if t.self_started]
                return claimed
            # Without session-state reports, a turn not begun within ``grace`` is not coming.
            found = await self.until(ready, None if self.state is not None else grace)
            if not isinstance(found, CliTurn):
                return claimed
            self._claim(found, run_id)
            try:
                await self.until(lambda turn=found: turn.done)
            except asyncio.CancelledError:
                await self.interrupt()
                raise
            if found.owner != "abandoned":  # not the late answer of a cancelled prompt
                claimed.append(found)

    async def interrupt(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self.client.interrupt()), 5)

    async def close(self) -> None:
        """End the session — unless it has background work running: then leave the CLI
        alone (only the shim dies with tether), so that it finishes that work and writes its
        wake turn, which the restarted tether recovers (``ClaudeProvider.adopt``)."""
        self.closing = True
        if self.client is not None and not (self.busy and not self.dead):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.client.disconnect(), 20)
        if self.reader is not None:
            self.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.reader


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
            self._runs[executable] = _version_problem(executable)
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

    def adopt(self, runtime: Any, items: list[Item]) -> None:
        """After a restart: background work of Claude Code sessions tether no longer reads.
        Their CLI lived on (see ``SHIM``); once it exits, each item ends as its transcript
        says — and its wake run takes the turn the CLI wrote (``_written``) — or as lost."""
        by_thread: dict[str, list[Item]] = {}
        for item in items:
            by_thread.setdefault(item.thread_id, []).append(item)
        for thread_id, its in by_thread.items():
            task = asyncio.get_running_loop().create_task(
                self._follow(runtime, thread_id, its), name=f"claude orphan of {thread_id}"
            )
            self._adopted.add(task)
            task.add_done_callback(self._adopted.discard)

    async def _follow(self, runtime: Any, thread_id: str, items: list[Item]) -> None:
        written: dict[str, WrittenTurn] = {}
        try:
            with runtime.store.transaction() as tx:
                thread = tx.get(Thread, thread_id)
            saved = (thread.state.get("claude") or {}) if thread is not None else {}
            if saved.get("pid"):
                await process_exit(int(saved["pid"]), saved.get("pidStart"))
            written = await self._transcript(saved.get("sessionId"), runtime.workspace)
        except asyncio.CancelledError:
            raise
        except Exception:  # never leave the items open: they end as lost below
            log.exception("claude thread %s: could not follow its orphaned session", thread_id)
        for item in items:
            end = written.get(item.label or "")
            try:
                if end is None:
                    runtime.commands.process_ended(item.id, None, reason=LOST)
                else:
                    code, reason = _exit_code(end.summary), NOTIFICATION_END.get(end.status, "failed")
                    runtime.commands.process_ended(item.id, code, reason=reason, tail=end.summary)
            except Exception:
                log.exception("claude thread %s: could not end item %s", thread_id, item.id)

    @staticmethod
    async def _transcript(session_id: str | None, workspace: Path) -> dict[str, WrittenTurn]:
        if not session_id:
            return {}
        _load_sdk()
        messages = await asyncio.to_thread(sdk.get_session_messages, session_id, str(workspace))
        return written_turns(messages)

    async def _written(self, turn: Turn, item_id: str | None) -> WrittenTurn | None:
        """The wake turn Claude Code wrote for ``item_id``'s end while tether was down."""
        if not item_id:
            return None
        with turn.runtime.store.transaction() as tx:
            item = tx.get(Item, item_id)
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
            turn.thread.id, turn.runtime.commands, self.notification_grace_s, Path(turn.workspace)
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
        options = sdk.ClaudeAgentOptions(
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
        client = sdk.ClaudeSDKClient(options)
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

    @staticmethod
    def _cli_dir(turn: Turn) -> Path | None:
        """Where this environment keeps the shim, the pid files and MCP configs."""
        environment = turn.runtime.environment
        if environment is None:
            return None
        directory = Path(environment.data_dir) / "providers" / "claude"
        directory.mkdir(parents=True, exist_ok=True)
        return directory

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
        environment = turn.runtime.environment
        base = getattr(environment, "base_url", None)
        if environment is None or not base:
            log.warning(
                "claude thread %s: no base URL known; the session gets no tether tools", turn.thread.id
            )
            return None
        _, token = environment.mint_token(
            f"claude session of {turn.thread.id}", "thread", turn.thread.id, self.credential_ttl_s
        )
        path = Path(environment.data_dir) / "providers" / "claude" / f"{turn.thread.id}.mcp.json"
        body = {
            "mcpServers": {
                "tether": {
                    "type": "http",
                    "url": f"{base}/mcp",
                    "headers": {"Authorization": f"Bearer {token}"},
                }
            }
        }
        write_private(path, json.dumps(body))
        return str(path)
