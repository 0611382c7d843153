"""Fewer transactions, same history (#13).

A running turn's writes that nothing waits on (its start time, its provider state, what it
says) join the next command's transaction instead of committing alone; a peer's feed is
applied one received chunk per transaction. Each test checks both halves: the commits
saved, and that nothing was lost, reordered or applied twice.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tether_world import World

from tether.domain.records import Link, Run, Task, Thread
from tether.domain.types import Delivery, RunStatus, TaskStatus
from tether.domain.views import task_view
from tether.engine.units import FLUSH_DELAY
from tether.errors import NotFound
from tether.peers.client import sse_events
from tether.types import ADMIN


@pytest.fixture
def quiet(tmp_path: Path) -> Any:
    """A world whose harness adds no transactions of its own (so commits can be counted)."""
    w = World(tmp_path / "tether.db", check_every_commit=False)
    yield w
    w.close()


def _said(world: World, thread_id: str) -> list[str]:
    return [m.text for m in world.messages(thread_id) if m.role == "assistant"]


async def test_a_turns_writes_join_the_next_command(quiet: World) -> None:
    thread_id, run_id = quiet.parent()
    caller = quiet.as_thread(thread_id)
    before = quiet.store.commits
    quiet.commands.begin_turn(run_id)
    quiet.commands.set_state(caller, {"fired": [0]})
    quiet.commands.say(caller, "one")
    quiet.commands.set_state(caller, {"fired": [0, 1]})
    quiet.commands.say(caller, "two")
    assert quiet.store.commits == before, "nothing committed yet"
    quiet.commands.end_run(run_id, RunStatus.COMPLETED, "two")
    assert quiet.store.commits == before + 1, "all of it rode on end_run's transaction"
    assert _said(quiet, thread_id) == ["one", "two"]
    assert quiet.thread(thread_id).state == {"fired": [0, 1]}
    assert quiet.run(run_id).status == RunStatus.COMPLETED


async def test_deferred_writes_nothing_carried_commit_together_soon_after(quiet: World) -> None:
    """Not on the loop's next turn (a command may yet come and carry them), but
    ``FLUSH_DELAY`` later, in one transaction."""
    thread_id, _ = quiet.parent()
    caller = quiet.as_thread(thread_id)
    before = quiet.store.commits
    committed = asyncio.Event()
    quiet.on_commit = committed.set
    loop = asyncio.get_running_loop()
    start = loop.time()
    quiet.commands.say(caller, "a")
    quiet.commands.say(caller, "b")
    await asyncio.sleep(0)
    assert quiet.store.commits == before
    await asyncio.wait_for(committed.wait(), 5)
    assert loop.time() - start >= FLUSH_DELAY - 0.001
    assert quiet.store.commits == before + 1
    assert _said(quiet, thread_id) == ["a", "b"]


async def test_a_rolled_back_command_hands_deferred_writes_on(quiet: World) -> None:
    thread_id, _ = quiet.parent()
    quiet.commands.say(quiet.as_thread(thread_id), "kept")
    with pytest.raises(NotFound):
        quiet.commands.post_message(ADMIN, "thr_missing", "x")
    assert _said(quiet, thread_id) == [], "rolled back with the failed command"
    quiet.commands.post_message(ADMIN, thread_id, "next")
    assert _said(quiet, thread_id) == ["kept"], "carried by the next command, once"
    await asyncio.sleep(0)
    assert _said(quiet, thread_id) == ["kept"]


async def test_a_query_reads_what_a_turn_just_said(quiet: World) -> None:
    thread_id, _ = quiet.parent()
    quiet.commands.say(quiet.as_thread(thread_id), "visible")
    view = quiet.queries.thread(ADMIN, thread_id)
    assert "visible" in [m["text"] for m in view["messages"]]


async def test_a_failing_deferred_write_is_dropped_not_repeated(quiet: World) -> None:
    thread_id, _ = quiet.parent()
    caller = quiet.as_thread(thread_id)

    def broken(u: Any) -> None:
        raise RuntimeError("a bug")

    quiet.commands.say(caller, "before")
    quiet.commands.later(broken)
    quiet.commands.say(caller, "after")
    with pytest.raises(RuntimeError):
        quiet.commands.post_message(ADMIN, thread_id, "carrier")
    quiet.commands.post_message(ADMIN, thread_id, "next")
    assert _said(quiet, thread_id) == ["before", "after"]


def test_the_feed_parser_keeps_split_frames_for_the_next_chunk() -> None:
    first, rest = sse_events(': tether event feed\n\nid: 1\ndata: {"a": 1}\n\nid: 2\nda')
    assert first == [(1, {"a": 1})]
    second, rest = sse_events(rest + 'ta: {"a": 2}\r\n\r\n: keepalive\n\nid: 3\n')
    assert second == [(2, {"a": 2})]
    assert rest == "id: 3\n"


def _remote_task(world: World) -> tuple[str, str]:
    with world.store.transaction() as tx:
        tx.put(Link("env_b", "laptop", "http://b", "t", "2026-12-03T08:00:00.000Z"))
    parent_id, _ = world.parent()
    view = world.commands.delegate_remote(world.as_thread(parent_id), "env_b", "x")
    world.commands.remote_sent(view["taskId"], "thr_remote")
    world.end(parent_id, "delegated")
    return parent_id, view["taskId"]


async def test_a_create_taken_by_the_peer_goes_with_the_next_command_and_keeps_a_later_cancel(
    quiet: World,
) -> None:
    with quiet.store.transaction() as tx:
        tx.put(Link("env_b", "laptop", "http://b", "t", "2026-12-03T08:00:00.000Z"))
    parent_id, _ = quiet.parent()
    caller = quiet.as_thread(parent_id)
    view = quiet.commands.delegate_remote(caller, "env_b", "x")
    quiet.commands.cancel_task(caller, view["taskId"])  # decided while the create was on its way
    before = quiet.store.commits
    quiet.commands.remote_sent(view["taskId"], "thr_remote")  # the create's answer
    assert quiet.store.commits == before, "nothing committed yet"
    quiet.end(parent_id, "delegated")
    task = quiet.task(view["taskId"])
    assert task.child_thread_id == "thr_remote", "it rode on the next command"
    assert task.remote_pending == "cancel", "the cancel is still to send"
    quiet.commands.remote_sent(view["taskId"], call="cancel")
    quiet.commands.flush()
    assert quiet.task(view["taskId"]).remote_pending is None


def _as_peer_sees_it(world: World, task_id: str, **changes: Any) -> dict[str, Any]:
    task = world.task(task_id)
    for name, value in changes.items():
        setattr(task, name, value)
    return task_view(task)


def test_a_chunk_of_feed_events_is_one_transaction_applied_once(quiet: World) -> None:
    parent_id, task_id = _remote_task(quiet)
    working = _as_peer_sees_it(quiet, task_id, status=TaskStatus.RUNNING)
    ended = {"status": TaskStatus.COMPLETED, "completed_at": "2026-12-03T09:00:00.000Z"}
    done = _as_peer_sees_it(quiet, task_id, result={"text": "FINAL"}, **ended)
    before = quiet.store.commits
    chunk = [(7, working), (8, done), (8, done), (6, working)]
    assert quiet.commands.apply_remote_chunk("env_b", chunk) == 2, "a repeated or older id changes nothing"
    assert quiet.store.commits == before + 1
    assert quiet.commands.apply_remote_chunk("env_b", chunk) == 0, "a replayed chunk changes nothing"
    task = quiet.task(task_id)
    assert (task.status, task.delivery_state) == (TaskStatus.COMPLETED, Delivery.DELIVERED), "woken"
    assert len(quiet.wake_messages(parent_id)) == 1
    with quiet.store.read() as reader:
        assert reader.get(Link, "env_b").cursor == "8"
        assert reader.get(Thread, parent_id).status == "running"
        assert len(reader.find(Run, thread_id=parent_id, status=RunStatus.RUNNING)) == 1, "one wake"
        assert reader.get(Task, task_id).result == {"text": "FINAL"}


async def test_a_pid_rides_on_the_next_command_and_a_late_one_is_killed(quiet: World) -> None:
    thread_id, _ = quiet.parent()
    first, late = quiet.command(thread_id, awaited=True), quiet.command(thread_id)
    before = quiet.store.commits
    quiet.commands.process_spawned(first, 4242, "77")
    assert quiet.store.commits == before
    quiet.commands.stop_item(ADMIN, late, "stopped")
    assert (quiet.item(first).pid, quiet.item(first).pid_start) == (4242, "77")
    committed = asyncio.Event()
    quiet.on_commit = committed.set
    quiet.commands.process_spawned(late, 4343, None)  # spawned after the item was stopped
    await asyncio.wait_for(committed.wait(), 5)  # nothing carried it: committed on its own
    assert quiet.item(late).pid == 4343
    with quiet.store.read() as reader:
        kills = [row.payload for row in reader.outbox() if row.kind == "process.kill"]
    # The stop's own kill found no pid yet; the second one, queued with the pid, kills it.
    assert kills.count({"itemId": late}) == 2
