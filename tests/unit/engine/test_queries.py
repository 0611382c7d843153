"""The read path's views for the threads list: one row as ``threads`` reads it, and the
environment's counts."""

from __future__ import annotations

from tether_world import World

from tether.types import ADMIN, Caller


def test_a_thread_row_has_its_running_items_and_its_local_parents_title(world: World) -> None:
    parent_id, _ = world.parent()
    _task_id, child_id = world.delegate(parent_id)
    world.command(child_id)
    row = world.queries.thread_row(ADMIN, child_id)
    assert row is not None
    listed = next(t for t in world.queries.threads(ADMIN) if t["threadId"] == child_id)
    assert {k: row[k] for k in listed} == listed  # the same summary and attention as the list
    assert (row["running"], row["parentTitle"]) == (1, world.thread(parent_id).title or "untitled")
    assert world.queries.thread_row(ADMIN, parent_id)["parentTitle"] is None


def test_a_thread_row_is_none_when_missing_or_outside_the_callers_fence(world: World) -> None:
    parent_id, _ = world.parent()
    stranger = Caller(kind="link", token_id="tok_other")
    assert world.queries.thread_row(ADMIN, "thr_missing") is None
    assert world.queries.thread_row(stranger, parent_id) is None


def test_overview_counts_threads_and_running_items_per_thread(world: World) -> None:
    parent_id, _ = world.parent()
    _task_id, child_id = world.delegate(parent_id)
    world.command(child_id)
    world.command(child_id)
    overview = world.queries.overview()
    assert (overview["threads"], overview["background"]) == (2, 3)  # two commands and the task
    assert overview["runningByThread"] == {child_id: 2, parent_id: 1}
