"""Reading what Claude Code wrote into a session's transcript, and waiting for a Claude Code
process tether no longer reads (the ``claude`` provider after a restart, and for monitor
events, whose monitor and lines the CLI's stream does not name).

Pure functions over ``claude_agent_sdk.get_session_messages`` results (``type``, ``uuid``,
``message``): unit-tested without a CLI.
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass, field
from typing import Any

from tether.engine.processes import process_start_time

_NOTICE = re.compile(r"<task-notification>(.*?)</task-notification>", re.DOTALL)


def _tag(text: str, name: str) -> str | None:
    found = re.search(rf"<{name}>(.*?)</{name}>", text, re.DOTALL)
    return found.group(1).strip() if found else None


@dataclass
class WrittenTurn:
    """A wake turn Claude Code wrote into its session's transcript while tether was not
    reading it (tether was stopped; the CLI lived on): the end it reacted to, and its texts."""

    status: str
    summary: str | None
    texts: list[str] = field(default_factory=list)
    complete: bool = False


def _prompt_text(message: Any) -> str | None:
    """The text of a transcript's user message that opens a turn (None for anything else:
    an assistant message, a tool result)."""
    body = message.message if isinstance(message.message, dict) else {}
    content = body.get("content")
    blocks = content if isinstance(content, list) else [{"type": "text", "text": content or ""}]
    if message.type != "user" or any(isinstance(b, dict) and b.get("type") == "tool_result" for b in blocks):
        return None
    return "\n".join(str(b.get("text", "")) for b in blocks if isinstance(b, dict))


def written_turns(messages: list[Any]) -> dict[str, WrittenTurn]:
    """Task id → the turn that reacted to that task's end, read from a transcript
    (``claude_agent_sdk.get_session_messages``): a user message with a
    ``<task-notification>`` that has a ``<status>``, then the assistant's messages up to the
    next prompt. ``complete`` once the assistant ended the turn (not at a tool call)."""
    found: dict[str, WrittenTurn] = {}
    current: list[WrittenTurn] = []
    for message in messages:
        body = message.message if isinstance(message.message, dict) else {}
        blocks = body.get("content") if isinstance(body.get("content"), list) else []
        text = _prompt_text(message)
        if text is not None:
            current = []
            for notice in _NOTICE.findall(text):
                task_id, status = _tag(notice, "task-id"), _tag(notice, "status")
                if task_id and status:
                    found[task_id] = WrittenTurn(status, _tag(notice, "summary"))
                    current.append(found[task_id])
        elif message.type == "assistant" and current:
            texts = [str(b.get("text")) for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
            texts = [t for t in texts if t]
            done = body.get("stop_reason") not in (None, "tool_use")
            for turn in current:
                turn.texts.extend(texts)
                turn.complete = done
    return found


def event_notice(messages: list[Any], answer_uuid: str) -> tuple[str, list[str]] | None:
    """(task id, lines) of the monitor event the transcript's assistant message
    ``answer_uuid`` answers: the ``<task-notification>`` without ``<status>`` before it."""
    notice: tuple[str, list[str]] | None = None
    for message in messages:
        if message.type == "assistant" and message.uuid == answer_uuid:
            return notice
        text = _prompt_text(message)
        if text is None:
            continue
        events = [n for n in _NOTICE.findall(text) if _tag(n, "task-id") and not _tag(n, "status")]
        if events:
            lines = [line for n in events for line in (_tag(n, "event") or "").splitlines() if line.strip()]
            notice = (str(_tag(events[-1], "task-id")), lines or ["(monitor event)"])
    return None


async def process_exit(pid: int, start: str | None) -> None:
    """Return once process ``pid`` (started at ``start``, so not a recycled pid) has ended;
    it need not be our child. A pidfd tells when; without one, a check every half second."""
    if start is None or process_start_time(pid) != start:
        return
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        while process_start_time(pid) == start:
            await asyncio.sleep(0.5)  # no pidfd here: nothing to await but time
        return
    ended = asyncio.Event()
    loop.add_reader(fd, ended.set)
    try:
        await ended.wait()
    finally:
        loop.remove_reader(fd)
        os.close(fd)
