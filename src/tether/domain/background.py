"""The background item state machine: ``running → ended | failed | cancelled``."""

from __future__ import annotations

from tether.domain.records import Item
from tether.domain.types import DomainError, ItemKind, ItemStatus, Trigger

#: The wake trigger each kind of item raises when it ends.
WAKE_TRIGGER = {
    ItemKind.COMMAND: Trigger.BACKGROUND_COMMAND,
    ItemKind.MONITOR: Trigger.MONITOR_FINISHED,
    ItemKind.SCHEDULE: Trigger.SCHEDULED,
    ItemKind.AGENT: Trigger.BACKGROUND_COMMAND,
}


def end_status(reason: str | None) -> ItemStatus:
    """How a command or monitor whose process ended is recorded: it ``ended`` when it exited
    by itself or was killed at its timeout, it ``failed`` for any other ``reason`` (lost,
    could not be watched)."""
    return ItemStatus.ENDED if reason in (None, "timeout") else ItemStatus.FAILED


def end(item: Item, status: str, at: str, exit_code: int | None = None, reason: str | None = None) -> None:
    if not item.is_running:
        raise DomainError(f"background item {item.id} already {item.status}")
    if status == ItemStatus.RUNNING:
        raise DomainError("an item cannot end as running")
    item.status = status
    item.ended_at = at
    item.exit_code = exit_code
    item.reason = reason


def await_(item: Item) -> None:
    """``background_wait``: the thread now holds on this command until it ends."""
    if item.kind != ItemKind.COMMAND:
        raise DomainError(f"{item.id} is a {item.kind}; only commands can be awaited")
    item.awaited = True


def end_text(item: Item) -> str:
    """The notification a thread reads when the item ends."""
    name = f" {item.label}" if item.label else ""
    match item.kind:
        case ItemKind.COMMAND:
            if item.reason == "timeout":
                limit = f" of {item.timeout_ms} ms" if item.timeout_ms else ""
                how = f"timed out: it was killed at its timeout{limit}"
            elif item.exit_code is not None:
                how = f"exited with code {item.exit_code}"
            else:
                how = f"ended without an exit code ({item.reason or item.status})"
            return f"Background command{name} `{item.command}` {how}."
        case ItemKind.MONITOR:
            how = f"exit code {item.exit_code}" if item.exit_code is not None else item.reason or item.status
            return f"Monitor{name} `{item.command}` ended ({how})."
        case ItemKind.SCHEDULE:
            return item.text or "Scheduled wake."
        case ItemKind.AGENT:
            return f"Background agent{name} `{item.command}` ended ({item.reason or item.status})."
    return f"{item.kind} {item.id} ended."
