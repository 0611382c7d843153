"""The tools an agent thread calls. Providers call them directly, the MCP server exposes
them over the wire, and the HTTP API shares their code — one implementation.

Every method takes the :class:`~tether.types.Caller` first and keyword arguments named as
in SPEC §5, and returns a JSON-able dict. Failures raise :class:`~tether.errors.TetherError`
(``{code, message}``).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Protocol

from pydantic import ConfigDict, Field, with_config
from typing_extensions import TypedDict  # pydantic needs it on Python < 3.12

from tether.domain.types import ItemKind
from tether.engine.commands import Commands
from tether.engine.notify import Notifier
from tether.engine.queries import Queries
from tether.errors import Invalid, NotFound
from tether.types import Caller

#: How long ``background_wait`` waits for an id it does not know yet (see there).
AGENT_REPORT_GRACE_S = 2.0

#: Wait-mode calls and thread waits never block longer than this (G8).
MAX_WAIT_MS = 3_600_000
DEFAULT_WAIT_MS = 300_000

#: The providers a child can run on (``tether.providers.PROVIDERS``; a unit test keeps them equal).
ProviderName = Literal["script", "claude", "codex", "openai"]
TaskMode = Literal["async", "wait"]
SendMode = Literal["auto", "queue"]


@with_config(ConfigDict(extra="forbid"))
class Target(TypedDict, total=False):
    """Where the child runs; every field is optional."""

    environmentId: Annotated[
        str, Field(description="A linked environment's id or name; leave out for this environment.")
    ]
    provider: Annotated[
        ProviderName,
        Field(
            description="The child's agent; default: 'script' for a script object, else the "
            "environment's default provider."
        ),
    ]
    model: Annotated[
        str, Field(description="The model of the child's provider; default: the provider's configured one.")
    ]


def _timeout(timeout_ms: int | None) -> float:
    if timeout_ms is None:
        return DEFAULT_WAIT_MS / 1000
    if timeout_ms < 0 or timeout_ms > MAX_WAIT_MS:
        raise Invalid(f"timeoutMs must be between 0 and {MAX_WAIT_MS}")
    return timeout_ms / 1000


class LinkedEnvironment(Protocol):
    """One linked environment as the tools reach it (``tether.peers`` implements it)."""

    async def delegate(self, caller: Caller, task: str, **options: Any) -> dict[str, Any]: ...
    async def thread_wait(self, caller: Caller, thread_id: str, **options: Any) -> dict[str, Any]: ...
    async def thread_send(
        self, caller: Caller, thread_id: str, message: str, **options: Any
    ) -> dict[str, Any]: ...
    async def thread_read(self, caller: Caller, thread_id: str, after: int, limit: int) -> dict[str, Any]: ...
    async def thread_interrupt(self, caller: Caller, thread_id: str, stop: bool) -> dict[str, Any]: ...
    async def thread_list(self, caller: Caller) -> dict[str, Any]: ...


class PeerDirectory(Protocol):
    """The linked environments of this one (``tether.peers.Peers``)."""

    def resolve(self, ref: str | None) -> LinkedEnvironment: ...
    def list(self) -> list[dict[str, Any]]: ...


class Tools:
    """The tools, over this environment's commands and queries and its linked
    environments (``peers``; None: no links). ``notifier`` wakes the waits."""

    def __init__(
        self,
        commands: Commands,
        queries: Queries,
        notifier: Notifier,
        name: str,
        peers: PeerDirectory | None = None,
    ) -> None:
        self.commands = commands
        self.queries = queries
        self.notifier = notifier
        self.name = name
        self.peers = peers

    @property
    def environment_id(self) -> str:
        return self.commands.environment_id

    def _is_local(self, environment: str | None) -> bool:
        return environment in (None, "", self.environment_id, self.name)

    def _peer(self, environment: str | None) -> LinkedEnvironment:
        if self.peers is None:
            raise NotFound(f"no linked environment {environment!r}")
        return self.peers.resolve(environment)

    # ------------------------------------------------------------------ tasks

    async def delegate_task(
        self,
        caller: Caller,
        task: str | dict[str, Any],
        target: Target | None = None,
        mode: TaskMode = "async",
        timeoutMs: int | None = None,
        hold: bool = True,
        title: str | None = None,
        deadlineMs: int | None = None,
        onDeadline: str | None = None,
        label: str | None = None,
        clientRequestId: str | None = None,
    ) -> dict[str, Any]:
        text = task if isinstance(task, str) else json.dumps(task)
        target = target or Target()
        provider = target.get("provider") or ("script" if isinstance(task, dict) else None)
        timeout = _timeout(timeoutMs)
        model = target.get("model")
        options: dict[str, Any] = {
            "model": model,
            "provider": provider,
            "mode": mode,
            "hold": hold,
            "title": title,
            "deadline_ms": deadlineMs,
            "on_deadline": onDeadline,
            "label": label,
            "client_request_id": clientRequestId,
        }
        if self._is_local(target.get("environmentId")):
            view = self.commands.delegate(caller, text, **options)
        else:
            view = await self._peer(target.get("environmentId")).delegate(caller, text, **options)
        if mode != "wait":
            return view
        return await self._wait_for_task(caller, view["taskId"], timeout)

    async def _wait_for_task(self, caller: Caller, task_id: str, timeout: float) -> dict[str, Any]:
        def finished() -> dict[str, Any] | None:
            view = self.queries.task(caller, task_id)
            return view if view["status"] not in ("queued", "running") else None

        await self.notifier.wait_until([f"task:{task_id}"], finished, timeout)
        final = self.commands.end_wait(task_id)
        if final is not None:
            return {**final, "timedOut": False}
        view = self.queries.task(caller, task_id)
        return {"taskId": task_id, "status": view["status"], "timedOut": True}

    async def task_status(self, caller: Caller, taskId: str) -> dict[str, Any]:
        return self.queries.task(caller, taskId)

    async def task_cancel(self, caller: Caller, taskId: str, reason: str | None = None) -> dict[str, Any]:
        return self.commands.cancel_task(caller, taskId, reason)

    # ------------------------------------------------------------------ threads

    async def thread_wait(
        self,
        caller: Caller,
        threadId: str,
        environmentId: str | None = None,
        untilSettled: bool = False,
        afterRunId: str | None = None,
        timeoutMs: int | None = None,
    ) -> dict[str, Any]:
        if not self._is_local(environmentId):
            return await self._peer(environmentId).thread_wait(
                caller, threadId, untilSettled=untilSettled, afterRunId=afterRunId, timeoutMs=timeoutMs
            )
        timeout = _timeout(timeoutMs)
        self.queries.wait_state(caller, threadId, untilSettled, afterRunId)  # 404 and 422 first

        answer = await self.notifier.wait_until(
            [f"thread:{threadId}"],
            lambda: self.queries.wait_state(caller, threadId, untilSettled, afterRunId),
            timeout,
        )
        if answer is not None:
            return answer
        view = self.queries.thread(caller, threadId)
        ended = [r for r in view["runs"] if r["status"] not in ("queued", "running")]
        return {
            "threadId": threadId,
            "settled": view["settled"],
            "status": view["status"],
            "runId": ended[-1]["runId"] if ended else None,
            "timedOut": True,
        }

    async def thread_send(
        self,
        caller: Caller,
        threadId: str,
        message: str,
        environmentId: str | None = None,
        mode: SendMode = "auto",
        clientRequestId: str | None = None,
    ) -> dict[str, Any]:
        if not self._is_local(environmentId):
            return await self._peer(environmentId).thread_send(
                caller, threadId, message, mode=mode, client_request_id=clientRequestId
            )
        return self.commands.post_message(caller, threadId, message, mode, clientRequestId)

    async def thread_read(
        self,
        caller: Caller,
        threadId: str,
        environmentId: str | None = None,
        afterPosition: int = 0,
        limit: int = 100,
    ) -> dict[str, Any]:
        if not self._is_local(environmentId):
            return await self._peer(environmentId).thread_read(caller, threadId, afterPosition, limit)
        return self.queries.messages(caller, threadId, afterPosition, limit)

    async def thread_interrupt(
        self, caller: Caller, threadId: str, environmentId: str | None = None, stop: bool = False
    ) -> dict[str, Any]:
        if not self._is_local(environmentId):
            return await self._peer(environmentId).thread_interrupt(caller, threadId, stop)
        return self.commands.interrupt(caller, threadId, stop)

    async def thread_list(self, caller: Caller, environmentId: str | None = None) -> dict[str, Any]:
        if not self._is_local(environmentId):
            return await self._peer(environmentId).thread_list(caller)
        return {"environmentId": self.environment_id, "threads": self.queries.threads(caller)}

    # ------------------------------------------------------------------ background work

    def start_background(
        self,
        caller: Caller,
        command: str,
        label: str | None = None,
        awaited: bool = False,
        timeout_ms: int | None = None,
    ) -> dict[str, Any]:
        """A background command (providers' built-in ``bash`` with ``background``)."""
        return self.commands.start_process(
            caller, ItemKind.COMMAND, command, label=label, awaited=awaited, timeout_ms=timeout_ms
        )

    async def background_wait(self, caller: Caller, id: str) -> dict[str, Any]:
        try:
            return self.commands.background_wait(caller, id)
        except NotFound:
            if caller.thread_id is None:
                raise
            # An agent that runs its own background work (Claude Code) may call this with
            # its command's id before tether has read the report of that command (the two
            # travel on different channels): give the report a moment to arrive.
            found = await self.notifier.wait_until(
                [f"thread:{caller.thread_id}"], lambda: self._await_known(caller, id), AGENT_REPORT_GRACE_S
            )
            if found is None:
                raise
            return found

    def _await_known(self, caller: Caller, ref: str) -> dict[str, Any] | None:
        try:
            return self.commands.background_wait(caller, ref)
        except NotFound:
            return None

    async def monitor_start(
        self,
        caller: Caller,
        command: str,
        persistent: bool = False,
        timeoutMs: int | None = None,
        id: str | None = None,
    ) -> dict[str, Any]:
        return self.commands.start_process(
            caller, ItemKind.MONITOR, command, label=id, persistent=persistent, timeout_ms=timeoutMs
        )

    async def schedule_wake(self, caller: Caller, inMs: int, text: str, hold: bool = False) -> dict[str, Any]:
        return self.commands.schedule(caller, inMs, text, hold)

    async def environment_links(self, caller: Caller) -> dict[str, Any]:
        links = [] if self.peers is None or caller.kind == "link" else self.peers.list()
        return {"environmentId": self.environment_id, "name": self.name, "links": links}
