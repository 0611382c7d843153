"""The notifier is a doorbell: a waiter re-checks its condition after every ring, so a
ring it missed or an extra one can never make a wait answer wrongly or hang."""

from __future__ import annotations

import asyncio

from tether.engine.notify import Notifier


async def test_a_ring_on_a_key_wakes_its_waiter_to_check_again() -> None:
    notifier, state = Notifier(), {"value": None}
    waiting = asyncio.create_task(notifier.wait_until(["thread:1"], lambda: state["value"], timeout=10))
    await asyncio.sleep(0)  # the waiter has checked once and waits
    state["value"] = "done"
    notifier.notify(["thread:1"])
    assert await waiting == "done"


async def test_a_ring_on_another_key_does_not_end_the_wait() -> None:
    notifier, checks = Notifier(), []
    waiting = asyncio.create_task(
        notifier.wait_until(["thread:1"], lambda: checks.append(1) or None, timeout=0.2)
    )
    await asyncio.sleep(0)
    notifier.notify(["thread:2", "events"])
    assert await waiting is None
    assert len(checks) == 2  # the first check, and one at the timeout; none for thread:2


async def test_a_condition_already_true_returns_without_a_ring() -> None:
    assert await Notifier().wait_until(["x"], lambda: 42, timeout=None) == 42


async def test_a_change_between_check_and_wait_is_not_missed() -> None:
    """The event is cleared before the check, so a ring that comes after the check (even
    before the waiter sleeps) is kept and wakes it."""
    notifier, state = Notifier(), {"n": 0}

    def check() -> str | None:
        state["n"] += 1
        if state["n"] == 1:
            notifier.notify(["k"])  # the condition changes right after this check
            return None
        return "seen"

    assert await notifier.wait_until(["k"], check, timeout=5) == "seen"


async def test_a_timeout_answers_none_and_leaves_no_waiter_behind() -> None:
    notifier = Notifier()
    assert await notifier.wait_until(["a", "b"], lambda: None, timeout=0.01) is None
    assert notifier._waiters == {}


async def test_a_cancelled_wait_leaves_no_waiter_behind() -> None:
    notifier = Notifier()
    waiting = asyncio.create_task(notifier.wait_until(["a"], lambda: None, timeout=None))
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert waiting.cancelled() and notifier._waiters == {}
