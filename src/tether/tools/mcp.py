"""The agent tool surface over MCP (streamable HTTP at exactly ``/mcp``), with the official
``mcp`` SDK.

Each MCP tool is generated from the method of the same name on
:class:`~tether.tools.surface.Tools` — its parameters, types and defaults — so the API,
the built-in providers and MCP share one implementation and cannot drift apart. What is
written here is only what a model needs to read: the descriptions.

Identity comes from the request's bearer token on every call (admin token, link token, or
a per-thread credential), never from the MCP session: sessions vanish on restart,
identities do not.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable, Container
from contextlib import asynccontextmanager
from types import ModuleType
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tether import lazy
from tether.api.errors import error_response
from tether.environment import Environment
from tether.errors import Unauthorized
from tether.tools.surface import DEFAULT_WAIT_MS, MAX_WAIT_MS

log = logging.getLogger(__name__)

DESCRIPTIONS: dict[str, str] = {
    "delegate_task": (
        "Hand a task to a new child agent thread, here or in a linked environment. "
        "mode 'async' returns at once with the taskId; the child's answer comes back to you as a "
        "completion wake (a new turn) when the child has settled — do not poll for it. "
        "mode 'wait' blocks up to timeoutMs and returns the result; on timeout you get "
        "{taskId, status, timedOut: true} and the wake still comes later: never delegate the same "
        "work again. Later answers of the child arrive as follow-up tasks with their own wakes. "
        "With deadlineMs, you hear once (a task_deadline turn) if the task is still open then, "
        "or it is cancelled (onDeadline 'cancel')."
    ),
    "task_status": "Read a delegated task: status, workState, interim reply, result, progress, follow-ups.",
    "task_cancel": (
        "Cancel a delegated task: the child's run is interrupted, its background work is stopped and "
        "its own delegated tasks are cancelled. You are not woken for a task you cancel yourself."
    ),
    "thread_wait": (
        "Block until a thread is idle (or settled, with untilSettled) or timeoutMs passes. Prefer the "
        "completion wake over waiting on your own children."
    ),
    "thread_send": (
        "Send a message to a thread (here or in a linked environment): it starts a run there, or queues "
        "behind the running one. Sent to your own child after its task completed, it opens a follow-up "
        "task: the child's next answer wakes you."
    ),
    "thread_read": "Read a thread's messages after a position (oldest first).",
    "thread_interrupt": "Stop a thread's running turn; with stop, also its queued turns and background work.",
    "thread_list": "List the threads you can see in this or a linked environment.",
    "background_wait": (
        "Mark one of your background commands as awaited: you stay unsettled (your task does not "
        "complete) until it ends, and its end wakes you."
    ),
    "monitor_start": (
        "Run a shell command in the background whose output lines wake you (monitor_event turns, lines "
        "that arrive while you run are folded into one) and whose end wakes you once more "
        "(monitor_finished). Returns the monitor's id at once. A non-persistent monitor keeps your task "
        "open until it ends; a persistent one does not."
    ),
    "schedule_wake": (
        "Wake yourself after inMs milliseconds with text (a scheduled turn). With hold, your task stays "
        "open until then."
    ),
    "environment_links": "This environment's id and name, and the environments it links to.",
}

_WAIT = f"0 to {MAX_WAIT_MS}; default {DEFAULT_WAIT_MS}"

#: Parameter descriptions shared by every tool that has the parameter ...
PARAMETERS: dict[str, str] = {
    "taskId": "The task id (tsk_…), or the label you gave a task you delegated.",
    "threadId": "The thread id (thr_…).",
    "environmentId": "A linked environment's id or name; leave out for this environment.",
    "clientRequestId": "Idempotency key: repeating a call with the same key returns the first outcome.",
}

#: ... and those of one tool.
TOOL_PARAMETERS: dict[str, dict[str, str]] = {
    "delegate_task": {
        "task": "What the child should do: text, or a script object for the script provider.",
        "target": "Where the child runs; leave out for this environment's default provider and model.",
        "mode": "'async' (default): return at once; 'wait': block until the task ends or timeoutMs passes.",
        "timeoutMs": f"With mode 'wait': the longest to block, in milliseconds ({_WAIT}).",
        "hold": "Keep your own task open until this child's task ends (default true).",
        "title": "A short title, shown in lists and in the completion wake.",
        "deadlineMs": "Milliseconds after which, if the task is still open, onDeadline happens "
        "(default: none).",
        "onDeadline": (
            "'wake' (default): you get one task_deadline turn saying how the task stands, and the task "
            "goes on; 'cancel': the task is cancelled and you are woken with status cancelled."
        ),
        "label": "A short name of your choice for the task; task_status and task_cancel accept it "
        "in place of the task id.",
    },
    "task_cancel": {"reason": "Why, shown to the people watching."},
    "thread_wait": {
        "untilSettled": "Wait until settled (no held background work either), not just idle.",
        "afterRunId": "Also wait until this run and every run before it have ended.",
        "timeoutMs": f"The longest to block, in milliseconds ({_WAIT}); then timedOut is true.",
    },
    "thread_send": {
        "message": "The message text.",
        "mode": "'auto' (default) or 'queue': either way the message starts a run when the thread is "
        "idle and queues behind its running one otherwise; the answer's delivery says which.",
    },
    "thread_read": {
        "afterPosition": "Only messages after this position (default 0: from the first).",
        "limit": "At most this many messages (default 100).",
    },
    "thread_interrupt": {"stop": "Also cancel the thread's queued turns and stop all its background work."},
    "background_wait": {"id": "The background command's id (bg_…) or its label."},
    "monitor_start": {
        "command": "The shell command; it runs in the environment's workspace.",
        "persistent": "false (default): the monitor keeps your task open until it ends; true: it does not.",
        "timeoutMs": "Kill the command after this many milliseconds (its end still wakes you); "
        "default: no limit.",
        "id": "A label of your choice for the monitor, shown in lists and accepted wherever its id is.",
    },
    "schedule_wake": {
        "inMs": "Milliseconds from now (0 or more).",
        "text": "The text of the turn you will be woken with.",
        "hold": "Keep your task open until the wake (default false).",
    },
}


def describe(tool: str, parameter: str) -> str:
    """What the model reads about ``parameter`` of ``tool`` (a missing one is a bug: KeyError)."""
    return TOOL_PARAMETERS.get(tool, {}).get(parameter) or PARAMETERS[parameter]


def inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with its ``$ref``s replaced by their definitions: agents' MCP clients
    (Codex among them) read only plain, self-contained schemas."""
    definitions = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                found = resolve(definitions[ref.rsplit("/", 1)[-1]])
                return {**found, **{k: resolve(v) for k, v in node.items() if k != "$ref"}}
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    return dict(resolve(schema))


#: MCP sessions one link token or thread credential may hold open at once. The SDK's
#: table is shared by every caller; without a cap one token holder could fill it and lock
#: everyone else (the admin included) out until the sessions idle out.
SESSIONS_PER_TOKEN = 64


class _Guard:
    """Refuse a missing or bad token with 401, and a token past its session cap with 429,
    before the MCP transport sees the request.

    A class, not a function: Starlette's ``Route`` treats a plain function as a
    request-response endpoint, and an instance as a raw ASGI app.
    """

    def __init__(self, env: Environment, sdk: Sdk) -> None:
        self.env = env
        self._sdk = sdk
        self._sessions: dict[tuple[str, str | None], set[str]] = {}
        self._opening: Counter[tuple[str, str | None]] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers") or [])
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        try:
            caller = self.env.tokens.authenticate(token.strip() if scheme.lower() == "bearer" else None)
        except Unauthorized as error:
            await error_response(401, error.code, error.message)(scope, receive, send)
            return
        try:
            inner, live = await self._sdk.ready()
        except Exception as error:  # logged where it failed; said to every caller
            message = f"the MCP endpoint could not start: {error}"
            await error_response(503, "mcp_unavailable", message)(scope, receive, send)
            return
        if caller.kind == "admin" or b"mcp-session-id" in headers or scope.get("method") != "POST":
            await inner(scope, receive, send)
            return
        key = (caller.kind, caller.token_id or caller.thread_id)
        owned = self._owned(key, live)
        if len(owned) + self._opening[key] >= SESSIONS_PER_TOKEN:
            message = (
                f"this token already holds {len(owned)} open MCP sessions (at most {SESSIONS_PER_TOKEN}); "
                "reuse one (send its mcp-session-id) or close one with DELETE /mcp"
            )
            await error_response(429, "too_many_sessions", message)(scope, receive, send)
            return
        self._opening[key] += 1  # a place held while the answer (with its session id) is on its way
        held = True

        def release() -> None:
            """Give the place back once: when the session id is noted (it counts in ``owned``
            from then on, and counting it twice would refuse a token below its cap), or
            when the answer carried none."""
            nonlocal held
            if held:
                held = False
                self._opening[key] -= 1

        try:
            await inner(scope, receive, _noting_session(send, owned, release))
        finally:
            release()

    def _owned(self, key: tuple[str, str | None], live: Container[str]) -> set[str]:
        """The sessions ``key`` opened that the SDK still holds (``live``; closed ones drop out)."""
        owned = self._sessions.setdefault(key, set())  # one set per key: in-flight answers add to it
        owned.difference_update([session for session in owned if session not in live])
        return owned


def _noting_session(send: Send, owned: set[str], noted: Callable[[], None]) -> Send:
    """``send``, noting the session id an ``initialize`` answer hands out (then ``noted``)."""

    async def noting(message: Message) -> None:
        if message["type"] == "http.response.start":
            for name, value in message.get("headers", ()):
                if name.lower() == b"mcp-session-id":
                    owned.add(value.decode("latin-1"))
                    noted()
        await send(message)

    return noting




def _import_sdk() -> ModuleType:
    return lazy.load("tether.tools._mcp_sdk")


#: The SDK's app and the ids of its live sessions.
_Built = tuple[ASGIApp, Container[str]]


class Sdk:
    """The SDK's app, loaded off the start-up path.

    Importing the ``mcp`` SDK takes about a second, more than half of a restart. So the
    server comes up without it: the lifespan imports it on a worker thread (an import
    touches no store) and builds the app on the loop; a request that comes before then
    waits for it. Failing to load is logged once and answered 503 on every request, never
    a server that will not start for want of one endpoint.
    """

    def __init__(self, env: Environment) -> None:
        self.env = env
        self._built: asyncio.Future[_Built] | None = None

    @property
    def state(self) -> str:
        """``loading``, ``ready`` or ``failed`` (the health endpoint shows it)."""
        if self._built is None or not self._built.done():
            return "loading"
        return "failed" if self._built.exception() else "ready"

    async def ready(self) -> _Built:
        """The SDK's app and the ids of its live sessions, once they are there."""
        if self._built is None:
            raise RuntimeError("the server is not running (its lifespan has not started)")
        if self._built.done():
            return self._built.result()  # every request after start-up: no wait to set up
        return await asyncio.shield(self._built)  # a caller that gives up cancels only its wait

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        self._built = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()
        serving = asyncio.create_task(self._serve(self._built, stop), name="mcp")
        try:
            yield
        finally:
            stop.set()
            await serving

    async def _serve(self, built: asyncio.Future[_Built], stop: asyncio.Event) -> None:
        """Load, then keep the SDK's session manager running until ``stop``."""
        try:
            sdk = await asyncio.to_thread(_import_sdk)
            app, manager = sdk.build(self.env)
            async with manager.run():
                built.set_result((app, manager._server_instances))  # the SDK's live sessions
                await stop.wait()
        except Exception as error:
            log.exception("the MCP endpoint failed")
            failed = asyncio.get_running_loop().create_future() if built.done() else built
            failed.set_exception(error)  # also answers the requests waiting for it
            failed.exception()  # retrieved here: each request reads it again
            self._built = failed


def build(env: Environment) -> tuple[ASGIApp, Sdk]:
    """The ``/mcp`` ASGI app (refusing a missing or bad token with 401) and the SDK behind
    it, whose lifespan the server runs."""
    sdk = Sdk(env)
    return _Guard(env, sdk), sdk
