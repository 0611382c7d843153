"""Background items (``tether.domain.background``) and the ``held`` rule of SPEC §1."""

from __future__ import annotations

import itertools

import pytest

from tether.domain import background
from tether.domain.records import Item
from tether.domain.types import DomainError, ItemKind, ItemStatus, Trigger

AT = "2026-01-01T00:00:00.000Z"
LATER = "2026-01-01T00:00:05.000Z"
ENDINGS = [ItemStatus.ENDED, ItemStatus.FAILED, ItemStatus.CANCELLED]


def make_item(kind: str = ItemKind.COMMAND, **fields: object) -> Item:
    return Item(id="bg_1", thread_id="thr_1", kind=kind, started_at=AT, **fields)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- end


@pytest.mark.parametrize("kind", list(ItemKind))
@pytest.mark.parametrize("status", ENDINGS)
def test_a_running_item_of_any_kind_ends_in_any_final_status(kind: ItemKind, status: ItemStatus) -> None:
    item = make_item(kind)
    background.end(item, status, LATER, exit_code=3, reason="why")
    assert item.status == status
    assert item.ended_at == LATER
    assert item.exit_code == 3
    assert item.reason == "why"
    assert not item.is_running


def test_end_defaults_exit_code_and_reason_to_none() -> None:
    item = make_item(exit_code=9, reason="old")
    background.end(item, ItemStatus.ENDED, LATER)
    assert (item.exit_code, item.reason) == (None, None)


@pytest.mark.parametrize(("ended", "again"), list(itertools.product(ENDINGS, ENDINGS)))
def test_an_ended_item_never_ends_again(ended: ItemStatus, again: ItemStatus) -> None:
    item = make_item()
    background.end(item, ended, AT, exit_code=0)
    with pytest.raises(DomainError):
        background.end(item, again, LATER, exit_code=1)
    assert (item.status, item.ended_at, item.exit_code) == (ended, AT, 0)


@pytest.mark.parametrize("kind", list(ItemKind))
def test_an_item_cannot_end_as_running(kind: ItemKind) -> None:
    item = make_item(kind)
    with pytest.raises(DomainError):
        background.end(item, ItemStatus.RUNNING, LATER)
    assert item.is_running and item.ended_at is None


def test_each_process_kind_has_its_own_wake_trigger() -> None:
    assert background.WAKE_TRIGGER == {
        ItemKind.COMMAND: Trigger.BACKGROUND_COMMAND,
        ItemKind.MONITOR: Trigger.MONITOR_FINISHED,
        ItemKind.SCHEDULE: Trigger.SCHEDULED,
        ItemKind.AGENT: Trigger.BACKGROUND_COMMAND,  # an agent's own subagent: the wake of background work
    }


# ---------------------------------------------------------------------------- await


def test_only_commands_can_be_awaited() -> None:
    command = make_item(ItemKind.COMMAND)
    background.await_(command)
    assert command.awaited and command.held


@pytest.mark.parametrize("kind", [ItemKind.MONITOR, ItemKind.SCHEDULE, ItemKind.TASK])
def test_awaiting_anything_but_a_command_is_refused(kind: ItemKind) -> None:
    item = make_item(kind)
    with pytest.raises(DomainError):
        background.await_(item)
    assert item.awaited is False


# ---------------------------------------------------------------------------- held


HELD_CASES = [
    # kind, flags, held while running
    (ItemKind.COMMAND, {"awaited": False}, False),
    (ItemKind.COMMAND, {"awaited": True}, True),
    # commands ignore the flags of other kinds
    (ItemKind.COMMAND, {"hold": True, "persistent": False}, False),
    (ItemKind.MONITOR, {"persistent": False}, True),
    (ItemKind.MONITOR, {"persistent": True}, False),
    (ItemKind.MONITOR, {"persistent": True, "hold": True, "awaited": True}, False),
    (ItemKind.SCHEDULE, {"hold": False}, False),
    (ItemKind.SCHEDULE, {"hold": True}, True),
    (ItemKind.SCHEDULE, {"awaited": True, "hold": False}, False),
    (ItemKind.TASK, {"hold": False}, False),
    (ItemKind.TASK, {"hold": True}, True),
    (ItemKind.TASK, {"awaited": True, "hold": False}, False),
]


@pytest.mark.parametrize(("kind", "flags", "held"), HELD_CASES)
def test_held_while_running(kind: ItemKind, flags: dict[str, bool], held: bool) -> None:
    assert make_item(kind, **flags).held is held


@pytest.mark.parametrize(("kind", "flags", "held"), HELD_CASES)
@pytest.mark.parametrize("status", ENDINGS)
def test_ended_items_are_never_held(
    kind: ItemKind, flags: dict[str, bool], held: bool, status: ItemStatus
) -> None:
    item = make_item(kind, **flags)
    background.end(item, status, LATER)
    assert item.held is False


def test_an_unknown_kind_is_not_held() -> None:
    assert make_item("gadget", awaited=True, hold=True).held is False


# ---------------------------------------------------------------------------- end_text


def test_command_end_text_with_exit_code_and_label() -> None:
    item = make_item(ItemKind.COMMAND, label="tests", command="pytest -q")
    background.end(item, ItemStatus.ENDED, LATER, exit_code=1)
    assert background.end_text(item) == "Background command tests `pytest -q` exited with code 1."


def test_command_end_text_without_exit_code_names_the_reason() -> None:
    item = make_item(ItemKind.COMMAND, command="make")
    background.end(item, ItemStatus.FAILED, LATER, reason="lost on restart")
    expected = "Background command `make` ended without an exit code (lost on restart)."
    assert background.end_text(item) == expected
    item2 = make_item(ItemKind.COMMAND, command="make")
    background.end(item2, ItemStatus.CANCELLED, LATER)
    assert "(cancelled)" in background.end_text(item2)


def test_command_end_text_says_it_timed_out() -> None:
    """SPEC §11: a command's own timeout_ms ends it, and its end says so."""
    item = make_item(ItemKind.COMMAND, label="suite", command="make test", timeout_ms=500)
    background.end(item, ItemStatus.ENDED, LATER, reason="timeout")
    expected = "Background command suite `make test` timed out: it was killed at its timeout of 500 ms."
    assert background.end_text(item) == expected


def test_monitor_end_text() -> None:
    item = make_item(ItemKind.MONITOR, label="log", command="tail -f x")
    background.end(item, ItemStatus.ENDED, LATER, exit_code=0)
    assert background.end_text(item) == "Monitor log `tail -f x` ended (exit code 0)."
    item2 = make_item(ItemKind.MONITOR, command="watch")
    background.end(item2, ItemStatus.ENDED, LATER, reason="timeout")
    assert background.end_text(item2) == "Monitor `watch` ended (timeout)."


def test_schedule_end_text_is_its_text_or_a_default() -> None:
    assert background.end_text(make_item(ItemKind.SCHEDULE, text="check the build")) == "check the build"
    assert background.end_text(make_item(ItemKind.SCHEDULE)) == "Scheduled wake."


@pytest.mark.parametrize(
    ("reason", "status"),
    [
        (None, ItemStatus.ENDED),
        ("timeout", ItemStatus.ENDED),
        ("lost", ItemStatus.FAILED),
        ("x", ItemStatus.FAILED),
    ],
)
def test_a_process_that_exited_or_timed_out_ended_any_other_end_failed(
    reason: str | None, status: str
) -> None:
    assert background.end_status(reason) == status
