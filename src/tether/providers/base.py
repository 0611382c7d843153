"""What a provider gets for one turn, and what it must do."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from tether.domain.records import Message, Run, Thread
from tether.types import Caller

if TYPE_CHECKING:
    from tether.engine.runtime import Runtime
    from tether.tools.surface import Tools


class Turn:
    """One provider turn of one run.

    ``inputs`` are the messages that triggered the run, oldest first (a user message, a
    wake's notification, monitor lines ...). ``tools`` is the agent tool surface bound to
    this thread and run: everything the provider does goes through it, so a run that was
    cancelled meanwhile is refused instead of acting late.
    """

    def __init__(
        self, runtime: Runtime, thread: Thread, run: Run, inputs: list[Message], first: Message | None
    ) -> None:
        self.runtime = runtime
        self.thread = thread
        self.run = run
        self.inputs = inputs
        self.first = first
        self.caller = Caller("thread", thread_id=thread.id, run_id=run.id)
        self.workspace = runtime.workspace

    @property
    def tools(self) -> Tools:
        return self.runtime.tools

    @property
    def text(self) -> str:
        return "\n\n".join(message.text for message in self.inputs)

    def say(self, text: str) -> None:
        self.runtime.commands.say(self.caller, text)

    def save_state(self, state: dict[str, Any]) -> None:
        self.runtime.commands.set_state(self.caller, state)
        self.thread.state = state


class Provider(Protocol):
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
