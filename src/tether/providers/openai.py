"""The ``openai`` provider: any OpenAI-compatible chat-completions endpoint drives a thread.

tether runs the tool loop itself: it streams a completion, assembles the text and the tool
calls from the deltas, runs the calls through the agent tool surface, feeds the results
back as ``tool`` messages and asks again, until the model answers without tool calls.
Each model text is written into the thread as an assistant message; the run's reply is
the last one.

The conversation is kept in the thread's state (``{"messages": [...]}``), so a later run
of the thread — a wake by a background command's end, a completion wake, a message —
continues it: that run's triggering messages are appended as ``user`` messages
(notifications with a ``[notification: KIND]`` prefix).

Tools offered to the model: ``bash`` (foreground, or ``background: true`` for a command
whose end wakes the thread) and every tool of SPEC §5, with JSON schemas generated from
the :class:`~tether.tools.surface.Tools` methods and the descriptions of
:mod:`tether.tools.mcp` — one source for MCP and for this provider.

Config (``[providers.openai]`` of ``DATA/config.toml``)::

    base_url = "http://127.0.0.1:11434/v1"   # required
    model = "qwen2.5-coder"                  # required
    api_key_env = "OPENAI_API_KEY"           # the variable holding the key; "" for none
    system_prompt = "..."                    # optional: replaces the built-in one
    temperature = 0.2                        # optional
    max_steps = 100                          # model calls per run before the run fails
    timeout = 600                            # seconds per model request
    max_retries = 2                          # retries of a failed request (by the client)
    foreground_timeout_ms = 600000           # default timeout of a foreground bash call
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
from collections.abc import Callable
from functools import cache, partial
from typing import Annotated, Any

from pydantic import BaseModel, Field, ValidationError, create_model

from tether import lazy
from tether.engine.processes import ProcessBackend
from tether.errors import TetherError
from tether.providers.base import Turn
from tether.tools.surface import Tools

DEFAULT_SYSTEM_PROMPT = (
    "You are an agent thread in tether, working in a shell workspace through the bash tool. "
    "For a long command (a test suite, a build) call bash with background true and end your turn: "
    "its end wakes you with a new turn that reports its exit code — do not poll or sleep for it. "
    "delegate_task hands work to another agent thread; its answer comes back to you as a completion "
    "wake, so do not poll for it either. The last text you write in a turn is your answer."
)

BASH_DESCRIPTION = (
    "Run a shell command in the workspace. In the foreground (default) you get its output and exit "
    "code. With background true it keeps running after this call returns {id, ...}; when it ends "
    "you are woken with a new turn reporting its exit code (use background_wait to keep your task "
    "open until then)."
)
BASH_PARAMETERS = {
    "command": "The shell command, in the workspace (/bin/sh -c; cmd.exe /c on Windows).",
    "background": "Run it in the background; its end wakes you.",
    "timeoutMs": "Foreground: kill it after this many milliseconds. Background: its time limit.",
}

#: Foreground output kept for the model (the tail, when longer).
MAX_OUTPUT = 30_000


def _bash(command: str, background: bool = False, timeoutMs: int | None = None) -> None:
    """Signature of the built-in ``bash`` tool (its schema is generated from this)."""


def _arguments_model(name: str, function: Any, describe: Callable[[str], str | None]) -> type[BaseModel]:
    """A pydantic model of a function's parameters (minus ``self`` and ``caller``)."""
    fields: dict[str, Any] = {}
    for parameter in inspect.signature(function, eval_str=True).parameters.values():
        if parameter.name in ("self", "caller"):
            continue
        default = ... if parameter.default is inspect.Parameter.empty else parameter.default
        annotated = Annotated[parameter.annotation, Field(description=describe(parameter.name))]
        fields[parameter.name] = (annotated, default)
    return create_model(f"{name}_arguments", **fields)


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "title" or not isinstance(v, str)}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    from tether.tools.mcp import inline_refs

    return strip(inline_refs(model.model_json_schema()))


@cache
def tool_models() -> dict[str, type[BaseModel]]:
    """Argument models of every tool offered to the model, by name."""
    from tether.tools.mcp import DESCRIPTIONS, describe  # the MCP SDK loads only when a model runs

    models = {"bash": _arguments_model("bash", _bash, BASH_PARAMETERS.get)}
    for name in DESCRIPTIONS:
        models[name] = _arguments_model(name, getattr(Tools, name), partial(describe, name))
    return models


@cache
def tool_schemas() -> list[dict[str, Any]]:
    """The ``tools`` of a chat-completions request."""
    from tether.tools.mcp import DESCRIPTIONS

    descriptions = {"bash": BASH_DESCRIPTION, **DESCRIPTIONS}
    return [
        {
            "type": "function",
            "function": {"name": name, "description": descriptions[name], "parameters": _schema(model)},
        }
        for name, model in tool_models().items()
    ]


def _error(code: str, message: str) -> str:
    return json.dumps({"error": {"code": code, "message": message}})


class OpenAIProvider:
    name = "openai"

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = config or {}
        self._client: Any = None

    # ------------------------------------------------------------------ setup

    @property
    def _key_env(self) -> str:
        return str(self.config.get("api_key_env", "OPENAI_API_KEY"))

    def check(self) -> str | None:
        if not self.config.get("base_url"):
            return "no base_url: set base_url in [providers.openai] of config.toml"
        if not self.config.get("model"):
            return "no model: set model in [providers.openai] of config.toml"
        if self._key_env and not os.environ.get(self._key_env):
            return f"the API key variable {self._key_env} is not set (api_key_env in [providers.openai])"
        if importlib.util.find_spec("openai") is None:
            return "the openai package is not installed (pip install openai)"
        return None

    def client(self) -> Any:
        if self._client is None:
            # Imported on first use (it is slow to import), in turn with other late imports.
            self._client = lazy.load("openai").AsyncOpenAI(
                base_url=self.config["base_url"],
                api_key=os.environ[self._key_env] if self._key_env else "none",
                timeout=float(self.config.get("timeout", 600)),
                max_retries=int(self.config.get("max_retries", 2)),
            )
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    # ------------------------------------------------------------------ the turn

    async def run_turn(self, turn: Turn) -> str | None:
        problem = self.check()
        if problem:
            raise RuntimeError(f"provider openai is not usable: {problem}")
        history: list[dict[str, Any]] = _repair(list(turn.thread.state.get("messages", [])))
        history.extend(_user_messages(turn))
        turn.save_state({**turn.thread.state, "messages": history})

        reply: str | None = None
        for _ in range(int(self.config.get("max_steps", 100))):
            text, calls, _finish = await self._complete(history)
            message: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                message["tool_calls"] = calls
            history.append(message)
            turn.save_state({**turn.thread.state, "messages": history})
            if text:
                turn.say(text)
                reply = text
            if not calls:
                return reply
            for call in calls:
                content = await self._call_tool(turn, call)
                history.append({"role": "tool", "tool_call_id": call["id"], "content": content})
                turn.save_state({**turn.thread.state, "messages": history})
        raise RuntimeError(f"the model made more than {self.config.get('max_steps', 100)} calls in one run")

    async def _complete(self, history: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]], str | None]:
        """One streamed completion: its text, its tool calls (assembled by index), its finish reason."""
        system = str(self.config.get("system_prompt") or DEFAULT_SYSTEM_PROMPT)
        options: dict[str, Any] = {}
        if "temperature" in self.config:
            options["temperature"] = float(self.config["temperature"])
        stream = await self.client().chat.completions.create(
            model=self.config["model"],
            messages=[{"role": "system", "content": system}, *history],
            tools=tool_schemas(),
            stream=True,
            **options,
        )
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        finish: str | None = None
        async with stream:
            async for chunk in stream:
                for choice in chunk.choices[:1]:
                    delta = choice.delta
                    if delta is not None and delta.content:
                        text.append(delta.content)
                    for fragment in (delta.tool_calls if delta is not None else None) or []:
                        call = calls.setdefault(fragment.index, {"id": None, "name": "", "arguments": ""})
                        if fragment.id:
                            call["id"] = fragment.id
                        if fragment.function is not None:
                            if fragment.function.name and fragment.function.name != call["name"]:
                                call["name"] += fragment.function.name
                            if fragment.function.arguments:
                                call["arguments"] += fragment.function.arguments
                    if choice.finish_reason:
                        finish = choice.finish_reason
        assembled = [
            {
                "id": call["id"] or f"call_{index}",
                "type": "function",
                "function": {"name": call["name"], "arguments": call["arguments"] or "{}"},
            }
            for index, call in sorted(calls.items())
        ]
        return "".join(text), assembled, finish

    # ------------------------------------------------------------------ tools

    async def _call_tool(self, turn: Turn, call: dict[str, Any]) -> str:
        """Run one tool call; the answer (or ``{"error": {code, message}}``) as JSON text."""
        name = call["function"]["name"]
        model = tool_models().get(name)
        if model is None:
            return _error("unknown_tool", f"there is no tool {name!r}; use one of {sorted(tool_models())}")
        try:
            raw = json.loads(call["function"]["arguments"] or "{}")
            if not isinstance(raw, dict):
                raise ValueError("the arguments must be a JSON object")
            arguments = model.model_validate(raw).model_dump()
        except (ValueError, ValidationError) as error:
            return _error("invalid", f"bad arguments for {name}: {error}")
        if "clientRequestId" in arguments and not arguments["clientRequestId"]:
            # A repeated call of this run (a retry) must not act twice (G9).
            arguments["clientRequestId"] = f"{turn.run.id}:{call['id']}"
        try:
            if name == "bash":
                result = await self._bash(turn, **arguments)
            else:
                result = await getattr(turn.tools, name)(turn.caller, **arguments)
        except TetherError as error:
            if error.code == "run_ended":
                raise  # this run was stopped: nothing more to say to the model
            return json.dumps({"error": error.to_dict()})
        return json.dumps(result)

    async def _bash(
        self, turn: Turn, command: str, background: bool = False, timeoutMs: int | None = None
    ) -> dict[str, Any]:
        if background:
            item = turn.tools.start_background(turn.caller, command, timeout_ms=timeoutMs)
            return {**item, "note": "running in the background; its end wakes you with a new turn"}
        timeout_ms = timeoutMs or int(self.config.get("foreground_timeout_ms", 600_000))
        return await run_foreground(turn.shell, command, str(turn.workspace), timeout_ms)


async def run_foreground(backend: ProcessBackend, command: str, cwd: str, timeout_ms: int) -> dict[str, Any]:
    """Run ``command`` to its end (or its timeout): ``{output, exitCode, timedOut}``."""
    output, code = await backend.run_shell(command, cwd, timeout_ms)
    if len(output) > MAX_OUTPUT:
        output = f"[... {len(output) - MAX_OUTPUT} characters cut ...]\n" + output[-MAX_OUTPUT:]
    return {"output": output, "exitCode": code, "timedOut": code is None}


def _user_messages(turn: Turn) -> list[dict[str, Any]]:
    """The run's triggering messages as chat messages."""
    found = []
    for message in turn.inputs:
        kind = (message.source or {}).get("kind")
        if message.role == "notification":
            text = f"[notification: {kind or 'tether'}] {message.text}"
        elif message.role == "system":
            text = f"[system] {message.text}"
        elif kind == "message":
            origin = (message.source or {}).get("origin") or {}
            text = f"[message from thread {origin.get('threadId', '?')}] {message.text}"
        else:
            text = message.text
        found.append({"role": "user", "content": text})
    if not found:
        found.append({"role": "user", "content": f"[notification: {turn.run.kind}] (no message)"})
    return found


def _repair(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Answer tool calls a stopped run left without a result (the API refuses such history)."""
    repaired: list[dict[str, Any]] = []
    index = 0
    while index < len(history):
        message = history[index]
        repaired.append(message)
        index += 1
        calls = message.get("tool_calls") or []
        if message.get("role") != "assistant" or not calls:
            continue
        answered = set()
        while index < len(history) and history[index].get("role") == "tool":
            answered.add(history[index].get("tool_call_id"))
            repaired.append(history[index])
            index += 1
        for call in calls:
            if call.get("id") not in answered:
                repaired.append(
                    {
                        "role": "tool",
                        "tool_call_id": call.get("id"),
                        "content": _error("interrupted", "the run was stopped before this call returned"),
                    }
                )
    return repaired
