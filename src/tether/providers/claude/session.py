"""One Claude Code session per thread (a live SDK client), read by one reader that splits
the CLI's messages into turns which runs then claim, and mirrors the CLI's own background
work (background Bash, Monitor, subagents) as tether items — see :mod:`tether.providers.claude`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tether.engine.port import AgentCommands
from tether.providers.claude.cli import load_sdk
from tether.providers.claude.transcript import event_notice
from tether.types import Caller

log = logging.getLogger(__name__)

#: Claude Code task types tether mirrors as background items, and their item kind (the
#: real CLI reports a Monitor as ``local_bash`` too: its tool's name tells). Other
#: background work the CLI wakes its agent for (a subagent, ...) is an ``agent`` item.
TASK_KINDS = {"local_bash": "command", "monitor": "monitor", "local_agent": "agent"}
#: A final status → the ``reason`` given to ``process_ended`` (None: ended normally).
NOTIFICATION_END = {"completed": None, "failed": "failed", "stopped": "stopped"}
UPDATED_END = {"completed": None, "failed": "failed", "killed": "stopped"}
_EXIT_CODE = re.compile(r"exit code:?\s*(-?\d+)", re.IGNORECASE)
LOST = "lost: the Claude Code session ended"


def exit_code(summary: str | None, code: Any = None) -> int | None:
    if code is None and summary:
        found = _EXIT_CODE.search(summary)
        code = int(found.group(1)) if found else None
    return int(code) if isinstance(code, int | str) and str(code).lstrip("-").isdigit() else None


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
            if isinstance(message, load_sdk().AssistantMessage) and message.parent_tool_use_id is None:
                found.extend(
                    b.text for b in message.content if isinstance(b, load_sdk().TextBlock) and b.text
                )
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
        self,
        thread_id: str,
        commands: AgentCommands,
        notification_grace: float = 0.5,
        workspace: Path | None = None,
    ) -> None:
        load_sdk()
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
        if isinstance(message, load_sdk().TaskStartedMessage):
            self._task_started(message)
        elif isinstance(message, load_sdk().TaskNotificationMessage):
            if message.status in NOTIFICATION_END:
                self._task_ended(message.task_id, NOTIFICATION_END[message.status], message.summary, None)
        elif isinstance(message, load_sdk().TaskUpdatedMessage):
            self._task_updated(message)
        elif isinstance(message, load_sdk().ResultMessage):
            self._result(message)
        elif isinstance(message, load_sdk().AssistantMessage | load_sdk().UserMessage):
            self._turn_message(message)
        elif isinstance(message, load_sdk().SystemMessage):
            self._system(message)

    def _system(self, message: Any) -> None:
        if message.subtype == "session_state_changed":
            self.state = message.data.get("state")
            if self.state == "idle":
                self.idle_seq = self.seq
        elif message.subtype == "init":
            self.session_id = message.data.get("session_id") or self.session_id

    def _turn_message(self, message: Any) -> None:
        if isinstance(message, load_sdk().AssistantMessage):
            for block in message.content:
                if isinstance(block, load_sdk().ToolUseBlock):
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
        first = next(
            (m.uuid for m in turn.messages if isinstance(m, load_sdk().AssistantMessage) and m.uuid), None
        )
        if first is None or not self.session_id or self.workspace is None:
            return
        notice = None
        for _ in range(60):  # the CLI writes its transcript a moment after it streams
            messages = await asyncio.to_thread(
                load_sdk().get_session_messages, self.session_id, str(self.workspace)
            )
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
        self.commands.process_ended(item_id, exit_code(summary, code), reason=reason, tail=summary or None)

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
