"""How a Claude Code session's messages map to tether: background items, their ends, and
which turn belongs to which run. Messages are parsed from the wire JSON by the SDK's own
parser, as the provider receives them."""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

import pytest
from claude_agent_sdk._internal.message_parser import parse_message

from tether.providers.claude.provider import ClaudeProvider
from tether.providers.claude.session import ClaudeSession, CliTurn
from tether.providers.claude.transcript import event_notice, written_turns

SID = "sess-1"


class Commands:
    """The two commands the session calls, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.persistent: dict[str, bool] = {}

    def start_process(
        self, caller: Any, kind: str, command: str, *, label: str, spawn: bool, persistent: bool = False
    ) -> dict[str, Any]:
        self.calls.append(("start", caller.thread_id, caller.run_id, kind, command, label, spawn))
        self.persistent[label] = persistent
        return {"id": f"bg_{label}"}

    def process_ended(
        self,
        item_id: str,
        exit_code: int | None,
        lines: Any = None,
        offset: Any = None,
        reason: str | None = None,
        tail: str | None = None,
    ) -> None:
        self.calls.append(("end", item_id, exit_code, reason, tail))

    def ends(self) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == "end"]


class Client:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.interrupted = 0
        self.wrote = asyncio.Event()

    async def query(self, prompt: Any) -> None:
        async for message in prompt:
            self.sent.append(message)
        self.wrote.set()

    async def interrupt(self) -> None:
        self.interrupted += 1


def session(grace: float = 0.0) -> tuple[ClaudeSession, Commands]:
    commands = Commands()
    found = ClaudeSession("thr_1", commands, notification_grace=grace)
    found.client = Client()
    return found, commands


def feed(s: ClaudeSession, *frames: dict[str, Any]) -> None:
    for frame in frames:
        s.handle(parse_message(frame))


def tool_use(tool_id: str, name: str, tool_input: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "assistant",
        "message": {
            "model": "m",
            "role": "assistant",
            "content": [{"type": "tool_use", "id": tool_id, "name": name, "input": tool_input}],
        },
        "parent_tool_use_id": None,
        "session_id": SID,
    }


def text(value: str, parent: str | None = None) -> dict[str, Any]:
    return {
        "type": "assistant",
        "message": {"model": "m", "role": "assistant", "content": [{"type": "text", "text": value}]},
        "parent_tool_use_id": parent,
        "session_id": SID,
    }


def started(task_id: str, tool_id: str, task_type: str = "local_bash", **extra: Any) -> dict[str, Any]:
    return {
        "type": "system",
        "subtype": "task_started",
        "task_id": task_id,
        "tool_use_id": tool_id,
        "description": "the suite",
        "task_type": task_type,
        "uuid": "u",
        "session_id": SID,
        **extra,
    }


def notification(
    task_id: str, status: str = "completed", summary: str = "done (exit code 0)"
) -> dict[str, Any]:
    return {
        "type": "system",
        "subtype": "task_notification",
        "task_id": task_id,
        "status": status,
        "output_file": f"/tmp/{task_id}.output",
        "summary": summary,
        "uuid": "u",
        "session_id": SID,
    }


def updated(task_id: str, status: str, **patch: Any) -> dict[str, Any]:
    return {
        "type": "system",
        "subtype": "task_updated",
        "task_id": task_id,
        "patch": {"status": status, **patch},
        "uuid": "u",
        "session_id": SID,
    }


def state(value: str) -> dict[str, Any]:
    return {
        "type": "system",
        "subtype": "session_state_changed",
        "state": value,
        "uuid": "u",
        "session_id": SID,
    }


def result(
    value: str, origin: str = "human", uuids: list[str] | None = None, error: bool = False
) -> dict[str, Any]:
    frame: dict[str, Any] = {
        "type": "result",
        "subtype": "error_during_execution" if error else "success",
        "duration_ms": 1,
        "duration_api_ms": 1,
        "is_error": error,
        "num_turns": 1,
        "session_id": SID,
        "result": value,
        "origin": {"kind": origin},
    }
    if uuids:
        frame["user_message_uuid"], frame["user_message_uuids"] = uuids[-1], uuids
    if error:
        frame["errors"] = [value]
    return frame


def background(s: ClaudeSession, task_id: str = "b1", command: str = "sleep 9; echo OK") -> None:
    feed(
        s,
        tool_use(f"toolu_{task_id}", "Bash", {"command": command, "run_in_background": True}),
        started(task_id, f"toolu_{task_id}"),
    )


# ---------------------------------------------------------------------------- background work


async def test_a_background_shell_becomes_an_item_tether_does_not_spawn() -> None:
    s, commands = session()
    background(s)
    assert commands.calls == [("start", "thr_1", None, "command", "sleep 9; echo OK", "b1", False)]
    assert s.owns("bg_b1")


async def test_a_monitor_becomes_a_monitor_item() -> None:
    s, commands = session()
    feed(s, tool_use("toolu_m", "Monitor", {"command": "tail -f log"}), started("m1", "toolu_m", "monitor"))
    assert commands.calls[0][3:6] == ("monitor", "tail -f log", "m1")
    assert commands.persistent == {"m1": False}


async def test_the_real_clis_monitor_is_a_local_bash_task_and_may_be_persistent() -> None:
    """Claude Code 2.1.3xx reports a Monitor as ``local_bash``: its tool's name tells."""
    s, commands = session()
    monitor = tool_use("toolu_m", "Monitor", {"command": "tail -f log", "persistent": True})
    feed(s, monitor, started("m1", "toolu_m", "local_bash", is_backgrounded=True))
    assert commands.calls[0][3:6] == ("monitor", "tail -f log", "m1")
    assert commands.persistent == {"m1": True}


async def test_foreground_subagents_are_not_background_work() -> None:
    s, commands = session()
    feed(s, started("a1", "toolu_a", "local_agent"))
    assert commands.calls == []
    feed(s, started("a2", "toolu_b", "local_agent", is_backgrounded=True))
    assert commands.calls[0][3] == "agent"  # not a command


async def test_a_long_foreground_command_is_not_background_work_until_sent_there() -> None:
    """Claude Code 2.1.3xx reports a foreground Bash of ~3 s as a task too."""
    s, commands = session()
    feed(s, started("f1", "toolu_f", "local_bash", is_backgrounded=False), notification("f1"))
    assert commands.calls == []
    feed(s, started("f2", "toolu_g", "local_bash", is_backgrounded=False))
    feed(s, updated("f2", "running", is_backgrounded=True))
    assert [c[3] for c in commands.calls] == ["command"]


async def test_work_a_subagent_started_is_not_the_threads() -> None:
    s, commands = session()
    feed(s, started("s1", "toolu_s", "local_bash", is_backgrounded=True, owned_by_subagent=True))
    assert commands.calls == []


async def test_a_notification_ends_the_item_once() -> None:
    s, commands = session()
    background(s)
    feed(s, notification("b1", summary='Background command "x" completed (exit code 0)'))
    feed(s, updated("b1", "completed"), notification("b1"))
    assert commands.ends() == [("end", "bg_b1", 0, None, 'Background command "x" completed (exit code 0)')]


@pytest.mark.parametrize(
    ("status", "reason"), [("completed", None), ("failed", "failed"), ("killed", "stopped")]
)
async def test_a_final_status_seen_only_as_updated_ends_the_item(status: str, reason: str | None) -> None:
    s, commands = session(grace=0.0)
    background(s)
    feed(s, updated("b1", "running"))
    assert commands.ends() == []
    feed(s, updated("b1", status))
    assert commands.ends() == [("end", "bg_b1", None, reason, None)]


async def test_an_updated_end_waits_its_grace_for_the_notification() -> None:
    s, commands = session(grace=30.0)
    background(s)
    feed(s, updated("b1", "completed"))
    assert commands.ends() == []  # the notification may follow
    feed(s, notification("b1", "failed", "failed with exit code 3"))
    assert commands.ends() == [("end", "bg_b1", 3, "failed", "failed with exit code 3")]
    assert s.pending_ends == {}


async def test_an_updated_end_without_notification_ends_after_the_grace() -> None:
    s, commands = session(grace=0.01)
    background(s)
    feed(s, updated("b1", "completed"))
    assert await s.until(commands.ends, timeout=10) == [("end", "bg_b1", None, None, None)]


async def test_ends_of_unknown_tasks_are_ignored() -> None:
    s, commands = session()
    feed(s, notification("nobody"), updated("nobody", "completed"))
    assert commands.calls == []


async def test_a_lost_session_ends_open_work() -> None:
    s, commands = session()
    background(s, "b1")
    background(s, "b2")
    feed(s, notification("b1"))

    async def nothing() -> Any:
        return
        yield

    await s.read(nothing())
    assert s.dead
    assert commands.ends()[1][:4] == ("end", "bg_b2", None, "lost: the Claude Code session ended")
    assert not s.owns("bg_b2")


# ---------------------------------------------------------------------------- turns and runs


async def test_a_prompt_takes_its_own_turn_and_leaves_the_clis_own() -> None:
    s, _ = session()
    background(s)
    feed(s, result("WAITING", uuids=["earlier"]))
    s.turns.clear()
    running = asyncio.create_task(s.prompt("status?", "run_2"))
    await s.client.wrote.wait()
    mine = s.client.sent[0]["uuid"]
    assert s.client.sent[0]["message"] == {"role": "user", "content": "status?"}
    # The CLI's own wake turn comes first, then the prompt's.
    feed(
        s, notification("b1"), state("running"), text("BUILD DONE"), result("BUILD DONE", "task-notification")
    )
    feed(s, text("STATUS OK"), result("STATUS OK", uuids=[mine]), state("idle"))
    [claimed] = await running
    assert (claimed.owner, claimed.texts, claimed.reply) == ("run_2", ["STATUS OK"], "STATUS OK")
    [woken] = await s.wake("bg_b1", "run_3", grace=5)
    assert (woken.owner, woken.texts) == ("run_3", ["BUILD DONE"])


async def test_a_wake_waits_for_the_clis_own_turn() -> None:
    s, _ = session()
    background(s)
    feed(s, result("WAITING", uuids=["u1"]), state("idle"))
    s.turns.clear()
    feed(s, notification("b1"))
    waking = asyncio.create_task(s.wake("bg_b1", "run_2", grace=5))
    feed(s, state("running"), text("FINAL"), text("inner", parent="toolu_x"))
    assert not waking.done()
    feed(s, result("FINAL", "task-notification"), state("idle"))
    [turn] = await waking
    assert turn.texts == ["FINAL"] and turn.reply == "FINAL"


async def test_a_wake_whose_notice_was_folded_into_a_turn_takes_none() -> None:
    """The CLI said idle after the end, with no turn of its own: nothing more will come."""
    s, _ = session()
    background(s)
    feed(s, notification("b1"), text("WAITING and it finished"), result("x", uuids=["u1"]), state("idle"))
    s.turns.clear()
    assert await s.wake("bg_b1", "run_2", grace=5) == []


async def test_without_session_states_a_wake_gives_up_after_the_grace() -> None:
    s, _ = session()
    background(s)
    feed(s, result("WAITING", uuids=["u1"]))
    s.turns.clear()
    feed(s, notification("b1"))
    assert await s.wake("bg_b1", "run_2", grace=0.05) == []


async def test_a_cancelled_prompt_interrupts_and_its_late_turn_is_nobodys() -> None:
    s, _ = session()
    running = asyncio.create_task(s.prompt("long job", "run_1"))
    await s.client.wrote.wait()
    mine = s.client.sent[0]["uuid"]
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert s.client.interrupted == 1
    feed(s, text("partial"), result("Request was aborted.", uuids=[mine], error=True))
    assert s.turns == []


async def test_an_error_result_is_the_turns_error() -> None:
    s, _ = session()
    feed(s, text("trying"), result("the model broke", uuids=["u"], error=True))
    [turn] = s.turns
    assert turn.error == "the model broke"
    assert s.last_reply is None


def test_a_turn_without_uuids_is_matched_by_origin() -> None:
    turn = CliTurn(seq=5, result=parse_message(result("hi")))
    assert turn.answers("any", sent_seq=4)
    assert not turn.answers("any", sent_seq=5)
    woken = CliTurn(seq=6, result=parse_message(result("hi", "task-notification")))
    assert woken.self_started and not woken.answers("any", sent_seq=1)


async def test_a_wake_takes_the_clis_turns_until_it_is_idle() -> None:
    """A monitor's events start turns of the CLI that no run asked for; the wake of its end
    takes them, in order, up to the turn that answers the end."""
    s, _ = session()
    feed(s, tool_use("toolu_m", "Monitor", {"command": "tail log"}), started("m1", "toolu_m", "monitor"))
    feed(s, result("WATCHING", uuids=["u1"]), state("idle"))
    s.turns.clear()
    feed(s, state("running"), text("PROGRESS"), result("PROGRESS", "task-notification"), state("idle"))
    feed(s, notification("m1"), state("running"))
    waking = asyncio.create_task(s.wake("bg_m1", "run_2", grace=5))
    feed(s, text("FINAL"), result("FINAL", "task-notification"), state("idle"))
    turns = await waking
    assert [t.reply for t in turns] == ["PROGRESS", "FINAL"]
    assert s.turns == []


def test_providers_says_how_to_install_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "claude_agent_sdk" else real(name, *a)
    )
    assert ClaudeProvider({}).check() == (
        "the claude-agent-sdk package is not installed: pip install 'tether[claude]'"
    )


def transcript(*entries: tuple[str, Any, str | None]) -> list[Any]:
    """Session messages as ``claude_agent_sdk.get_session_messages`` returns them."""
    from claude_agent_sdk import SessionMessage

    found = []
    for n, (kind, content, stop) in enumerate(entries):
        body: dict[str, Any] = {"role": kind, "content": content}
        if kind == "assistant":
            body["stop_reason"] = stop
        found.append(SessionMessage(type=kind, uuid=f"u{n}", session_id=SID, message=body))
    return found


def notice(task_id: str, status: str | None = None, event: str | None = None) -> str:
    parts = [f"<task-id>{task_id}</task-id>", f"<status>{status}</status>" if status else ""]
    parts.append("<summary>Background command completed (exit code 0)</summary>" if status else "")
    parts.append(f"<event>{event}</event>" if event else "")
    return "<system-reminder>\n<task-notification>\n" + "\n".join(parts) + "\n</task-notification>"


def test_the_wake_turn_a_cli_wrote_while_tether_was_down_is_read_back() -> None:
    """A task's end notice, then the assistant's texts up to its end of turn; a turn cut at
    a tool call is not complete (its wake run then prompts the session instead)."""
    found = written_turns(
        transcript(
            ("user", "go", None),
            ("assistant", [{"type": "text", "text": "WAITING"}], "end_turn"),
            ("user", notice("b1", "completed"), None),
            ("assistant", [{"type": "text", "text": "looking"}, {"type": "tool_use"}], "tool_use"),
            ("user", [{"type": "tool_result", "content": "ok"}], None),
            ("assistant", [{"type": "text", "text": "FINAL"}], "end_turn"),
            ("user", notice("b2", "failed"), None),
            ("assistant", [{"type": "tool_use"}], "tool_use"),
        )
    )
    assert (found["b1"].status, found["b1"].texts, found["b1"].complete) == (
        "completed",
        ["looking", "FINAL"],
        True,
    )
    assert found["b1"].summary == "Background command completed (exit code 0)"
    assert (found["b2"].status, found["b2"].complete) == ("failed", False)


def test_a_monitor_event_turn_is_traced_to_its_monitor_and_lines() -> None:
    messages = transcript(
        ("user", notice("m1", event="line1\nline2"), None),
        ("assistant", [{"type": "text", "text": "PROGRESS"}], "end_turn"),
        ("user", notice("m1", "completed", event="line3"), None),
        ("assistant", [{"type": "text", "text": "FINAL"}], "end_turn"),
    )
    assert event_notice(messages, "u1") == ("m1", ["line1", "line2"])
    assert event_notice(messages, "u3") == ("m1", ["line1", "line2"])  # an end is not an event
    assert event_notice(messages, "nope") is None
