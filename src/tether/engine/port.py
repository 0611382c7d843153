"""The provider port: what the engine hands a provider for one turn, and what it asks of it.

The engine owns this seam, so it imports nothing above itself: a provider (``providers/``)
implements :class:`Provider`; the runtime hands each turn a :class:`Turn` carrying the
:class:`Services` the environment lent it (``environment.py`` assembles them). The tool
surface and the credentials come in as the protocols below, which ``tools.surface.Tools``
and ``environment.Environment`` satisfy.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tether.domain.records import Message, Run, Thread
from tether.engine.processes import ProcessBackend
from tether.engine.unit import View
from tether.types import Caller


class AgentTools(Protocol):
    """The agent tool surface as providers call it (SPEC §5): the caller first, the
    arguments as the tools name them. ``getattr(tools, name)`` reaches the other tools."""

    def start_background(self, caller: Caller, command: str, **options: Any) -> dict[str, Any]: ...
    async def background_wait(self, caller: Caller, id: str) -> dict[str, Any]: ...
    async def monitor_start(self, caller: Caller, command: str, **options: Any) -> dict[str, Any]: ...
    async def schedule_wake(
        self, caller: Caller, inMs: int, text: str, hold: bool = False
    ) -> dict[str, Any]: ...
    async def delegate_task(
        self, caller: Caller, task: str | dict[str, Any], **options: Any
    ) -> dict[str, Any]: ...
    async def task_status(self, caller: Caller, taskId: str) -> dict[str, Any]: ...
    async def thread_send(
        self, caller: Caller, threadId: str, message: str, **options: Any
    ) -> dict[str, Any]: ...


class AgentCommands(Protocol):
    """The commands a turn reports through besides its tools: what its agent says and
    keeps, and the background work an agent runs itself (``spawn=False``) as it reports it."""

    def say(self, caller: Caller, text: str) -> None: ...
    def set_state(self, caller: Caller, state: dict[str, Any]) -> None: ...
    def start_process(self, caller: Caller, kind: str, command: str, **options: Any) -> dict[str, Any]: ...
    def monitor_output(self, item_id: str, lines: list[str], offset: int | None) -> None: ...
    def process_ended(self, item_id: str, exit_code: int | None, **report: Any) -> None: ...


class Credentials(Protocol):
    """Mints the credential an agent running out of process reaches ``/mcp`` with."""

    def thread_credential(self, thread_id: str, label: str, ttl_seconds: int) -> tuple[str, str] | None:
        """``(mcp url, token)`` acting as ``thread_id``; None when no URL is known."""
        ...


@dataclass(frozen=True)
class Services:
    """What the environment lends every turn — narrow on purpose: no store, no runtime."""

    commands: AgentCommands
    tools: AgentTools
    #: Where agents' commands run.
    workspace: Path
    #: The process backend, for foreground shells and process groups.
    shell: ProcessBackend
    #: A read-only snapshot (``Commands.view``), for what a provider looks up.
    view: Callable[[], AbstractContextManager[View]]
    #: Where providers keep their files (shims, pid files, MCP configs); None: nowhere.
    data_dir: Path | None = None
    credentials: Credentials | None = None

    def provider_dir(self, provider: str) -> Path | None:
        """``DATA/providers/NAME``, made on first use; None without a data directory."""
        if self.data_dir is None:
            return None
        directory = self.data_dir / "providers" / provider
        directory.mkdir(parents=True, exist_ok=True)
        return directory


class Turn:
    """One provider turn of one run.

    ``inputs`` are the messages that triggered the run, oldest first (a user message, a
    wake's notification, monitor lines ...). ``tools`` is the agent tool surface bound to
    this thread and run: everything the provider does goes through it, so a run that was
    cancelled meanwhile is refused instead of acting late.
    """

    def __init__(
        self, services: Services, thread: Thread, run: Run, inputs: list[Message], first: Message | None
    ) -> None:
        self.services = services
        self.thread = thread
        self.run = run
        self.inputs = inputs
        self.first = first
        self.caller = Caller("thread", thread_id=thread.id, run_id=run.id)
        self.workspace = services.workspace

    @property
    def tools(self) -> AgentTools:
        return self.services.tools

    @property
    def shell(self) -> ProcessBackend:
        return self.services.shell

    @property
    def text(self) -> str:
        return "\n\n".join(message.text for message in self.inputs)

    def say(self, text: str) -> None:
        self.services.commands.say(self.caller, text)

    def save_state(self, state: dict[str, Any]) -> None:
        self.services.commands.set_state(self.caller, state)
        self.thread.state = state


class Provider(Protocol):
    """Who writes a thread's turns. One whose agents run background work themselves
    (``Item.runner``) also has ``adopt(services, items)``: after a restart it reports each
    such item's end, as the agent reports it, once it knows (see ``Runtime.start``)."""

    name: str

    def check(self) -> str | None:
        """None when this provider can run here; otherwise why not (shown to users)."""
        ...

    async def run_turn(self, turn: Turn) -> str | None:
        """Carry out the turn; return the run's reply (None: no reply). Raising fails the run
        with the exception's message."""
        ...

    async def close(self) -> None:
        """Release sessions and processes (the environment is shutting down)."""
        ...
