"""The ``script`` provider: a deterministic agent driven by a JSON script (SPEC §3).

The thread's first message (a delegated task's text) is the script. Each run fires the
first rule not yet fired whose ``on`` matches it; fired rules and the ids of background
commands and monitors are kept in the thread's state, so they survive restarts (a
``delegate``'s id is its task's label, kept with the task). The rule counts as fired when
its run starts: it is saved before the first action runs.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from tether.domain.types import Trigger
from tether.providers.base import Turn

_ACTIONS = {
    "reply": set(),
    "bash": {"background", "id", "await", "timeout_ms"},
    "background_wait": set(),
    "monitor": {"persistent", "timeout_ms", "id"},
    "schedule": set(),
    "delegate": set(),
    "task_status": set(),
    "thread_send": set(),
    "sleep_ms": set(),
    "fail": set(),
}
_ON = {"start", "any", *(str(kind) for kind in Trigger)}
_TEMPLATE = re.compile(r"\{\{\s*([A-Za-z0-9_.:\-]+)\s*\}\}")
_FOREGROUND_TIMEOUT_MS = 600_000


class ScriptError(Exception):
    """The first message is not a valid script; the run fails with this message."""


class ScriptFailure(Exception):
    """A ``fail`` action."""


@functools.lru_cache(maxsize=64)
def parse_script(text: str) -> dict[str, Any]:
    """Parse and check a script; the error says what is wrong and where. Cached: a thread's
    script (its first message) is read again on every turn, and a fan-out parent's is big;
    callers only read the result."""
    try:
        script = json.loads(text)
    except ValueError:
        try:
            script = yaml.safe_load(text)
        except yaml.YAMLError:
            script = None
        if not isinstance(script, dict):
            raise ScriptError("the first message is not a script: it is neither JSON nor YAML") from None
    if not isinstance(script, dict) or script.get("tether_script") != 1:
        raise ScriptError('a script must be an object with "tether_script": 1')
    rules = script.get("rules")
    if not isinstance(rules, list):
        raise ScriptError('a script needs "rules": a list of {"on": ..., "do": [...]}')
    for n, rule in enumerate(rules, 1):
        _check_rule(n, rule)
    return script


def _check_rule(n: int, rule: Any) -> None:
    if not isinstance(rule, dict) or not isinstance(rule.get("on"), str):
        raise ScriptError(f'rule {n}: needs "on" (a trigger kind, "start" or "any")')
    if rule["on"] not in _ON:
        raise ScriptError(f"rule {n}: unknown trigger {rule['on']!r}; use one of {sorted(_ON)}")
    actions = rule.get("do", [])
    if not isinstance(actions, list):
        raise ScriptError(f'rule {n}: "do" must be a list of actions')
    for m, action in enumerate(actions, 1):
        names = [key for key in action if key in _ACTIONS] if isinstance(action, dict) else []
        if len(names) != 1:
            raise ScriptError(f"rule {n} action {m}: expected exactly one of {sorted(_ACTIONS)}")
        extra = set(action) - {names[0]} - _ACTIONS[names[0]]
        if extra:
            raise ScriptError(f"rule {n} action {m}: unknown fields {sorted(extra)} for {names[0]!r}")


def select_rule(script: dict[str, Any], kind: str, first_run: bool, fired: set[int]) -> int | None:
    """The index of the first rule that matches the run and has not fired (or repeats)."""
    for index, rule in enumerate(script["rules"]):
        if index in fired and not rule.get("repeat"):
            continue
        on = rule["on"]
        if on == "any" or on == kind or (on == "start" and first_run):
            return index
    return None


@dataclass
class _Context:
    text: str
    tasks: dict[str, dict[str, Any]]
    last: dict[str, Any] = field(default_factory=dict)

    def render(self, template: Any) -> str:
        return _TEMPLATE.sub(lambda m: self._lookup(m.group(1)), str(template))

    def _lookup(self, name: str) -> str:
        if name == "text":
            return self.text
        parts = name.split(".")
        if parts[0] == "last" and len(parts) == 2:
            value = self.last.get(parts[1])
        elif parts[0] == "tasks" and len(parts) >= 3:
            value = self.tasks.get(".".join(parts[1:-1]), {}).get(parts[-1])
        else:
            return "{{" + name + "}}"
        return "" if value is None else str(value)


class ScriptProvider:
    """Needs nothing: always usable."""

    name = "script"

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = config or {}

    def check(self) -> str | None:
        return None

    async def close(self) -> None:
        return None

    async def run_turn(self, turn: Turn) -> str | None:
        if turn.first is None:
            raise ScriptError("the thread has no first message, so no script")
        script = parse_script(turn.first.text)
        state = {"fired": [], "ids": {}, "tasks": {}, **turn.thread.state}
        index = select_rule(script, turn.run.kind, turn.run.seq == 1, set(state["fired"]))
        if index is None:
            return None
        state["fired"] = sorted({*state["fired"], index})
        if state != turn.thread.state:  # a repeating rule's later runs have nothing new to keep
            turn.save_state(state)
        context = _Context(turn.text, state["tasks"])
        reply: str | None = None
        saved = _copy(state)
        for number, action in enumerate(script["rules"][index].get("do", [])):
            # One loop step between actions, as a real agent's tool calls come one request
            # each: a script of hundreds of delegations must not hold the loop (on a shared
            # store a process whose heartbeat is starved past its lease is taken for gone).
            # None before the first: the turn just got its step, and a step here would
            # commit the turn's deferred start alone instead of with the first action.
            if number:
                await asyncio.sleep(0)
            name = next(key for key in action if key in _ACTIONS)
            said = await getattr(self, f"_{name}")(turn, action, context, state, f"{turn.run.id}:{number}")
            if name == "reply":
                reply = said
            if state != saved:  # an action recorded an id or a task: keep it durable
                turn.save_state(state)
                saved = _copy(state)
        return reply

    # Actions. Each takes (turn, action, context, state, key); ``key`` is unique per run and
    # action, and serves as the clientRequestId of anything the action creates.

    async def _reply(self, turn: Turn, action: dict, context: _Context, state: dict, key: str) -> str:
        text = context.render(action["reply"])
        turn.say(text)
        return text

    async def _bash(self, turn: Turn, action: dict, context: _Context, state: dict, key: str) -> None:
        command = context.render(action["bash"])
        if action.get("background"):
            item = turn.tools.start_background(
                turn.caller,
                command,
                label=action.get("id"),
                awaited=bool(action.get("await")),
                timeout_ms=action.get("timeout_ms"),
            )
            if action.get("id"):
                state["ids"][action["id"]] = item["id"]
            return
        output, code = await _run_foreground(
            command, turn, action.get("timeout_ms") or _FOREGROUND_TIMEOUT_MS
        )
        context.last = {"output": output, "exit_code": code}

    async def _background_wait(
        self, turn: Turn, action: dict, context: _Context, state: dict, key: str
    ) -> None:
        ref = action["background_wait"]
        await turn.tools.background_wait(turn.caller, id=state["ids"].get(ref, ref))

    async def _monitor(self, turn: Turn, action: dict, context: _Context, state: dict, key: str) -> None:
        item = await turn.tools.monitor_start(
            turn.caller,
            command=context.render(action["monitor"]),
            persistent=bool(action.get("persistent")),
            timeoutMs=action.get("timeout_ms"),
            id=action.get("id"),
        )
        if action.get("id"):
            state["ids"][action["id"]] = item["id"]

    async def _schedule(self, turn: Turn, action: dict, context: _Context, state: dict, key: str) -> None:
        spec = action["schedule"]
        await turn.tools.schedule_wake(
            turn.caller,
            inMs=int(spec.get("in_ms", 0)),
            text=context.render(spec.get("text", "")),
            hold=bool(spec.get("hold", False)),
        )

    async def _delegate(self, turn: Turn, action: dict, context: _Context, state: dict, key: str) -> None:
        spec = action["delegate"]
        task = spec.get("task")
        target = {"environmentId": spec.get("environment"), "provider": spec.get("provider")}
        result = await turn.tools.delegate_task(
            turn.caller,
            task=context.render(task) if isinstance(task, str) else task,
            target={k: v for k, v in target.items() if v},
            mode=spec.get("mode", "async"),
            timeoutMs=spec.get("timeout_ms"),
            hold=spec.get("hold", True),
            title=spec.get("title"),
            deadlineMs=spec.get("deadline_ms"),
            onDeadline=spec.get("on_deadline"),
            label=spec.get("id"),
            clientRequestId=key,
        )
        # The id is the task's label, which the task tools accept: it is not added to the
        # state, which a fan-out of a thousand delegations would grow and rewrite each time.
        ref = spec.get("id")
        if spec.get("mode") == "wait":
            _remember(context, result, ref)

    async def _task_status(self, turn: Turn, action: dict, context: _Context, state: dict, key: str) -> None:
        ref = action["task_status"]
        view = await turn.tools.task_status(turn.caller, taskId=_task_ref(state, ref))
        _remember(context, view, ref)

    async def _thread_send(self, turn: Turn, action: dict, context: _Context, state: dict, key: str) -> None:
        spec = action["thread_send"]
        thread, environment = spec.get("thread", ""), spec.get("environment")
        if thread.startswith("child:"):
            ref = thread.removeprefix("child:")
            view = await turn.tools.task_status(turn.caller, taskId=_task_ref(state, ref))
            thread, environment = view["childThreadId"], environment or view["childEnvironmentId"]
        await turn.tools.thread_send(
            turn.caller,
            threadId=thread,
            environmentId=environment,
            message=context.render(spec.get("text", "")),
            clientRequestId=key,
        )

    async def _sleep_ms(self, turn: Turn, action: dict, context: _Context, state: dict, key: str) -> None:
        await asyncio.sleep(int(action["sleep_ms"]) / 1000)

    async def _fail(self, turn: Turn, action: dict, context: _Context, state: dict, key: str) -> None:
        raise ScriptFailure(context.render(action["fail"]))


def _copy(state: dict[str, Any]) -> dict[str, Any]:
    """A copy to compare ``state`` with after an action: actions only set entries of its
    containers (never change a value in place), so copying each container is enough — and
    far cheaper than encoding a state that holds a thousand task ids after every action."""
    return {key: value.copy() if isinstance(value, dict | list) else value for key, value in state.items()}


def _task_ref(state: dict[str, Any], ref: str) -> str:
    """What names task ``ref`` to the task tools: the ref itself (a task id, or the label a
    ``delegate`` gave it), or — in a state kept before tasks had labels — the task id
    recorded for it. Only a task id counts: a command's id may share the ref."""
    recorded = state["ids"].get(ref)
    return recorded if isinstance(recorded, str) and recorded.startswith("tsk_") else ref


def _remember(context: _Context, view: dict[str, Any], ref: str | None) -> None:
    seen = {"status": view.get("status"), "result": (view.get("result") or {}).get("text")}
    context.tasks[view["taskId"]] = seen
    if ref:
        context.tasks[ref] = seen


async def _run_foreground(command: str, turn: Turn, timeout_ms: int) -> tuple[str, int]:
    """Run a foreground command; on timeout it is killed and reports exit code 124, as
    ``timeout(1)`` does, so a script can react instead of failing its run."""
    output, code = await turn.shell.run_shell(command, str(turn.workspace), timeout_ms)
    return ("(timed out)", 124) if code is None else (output.rstrip("\n"), code)
