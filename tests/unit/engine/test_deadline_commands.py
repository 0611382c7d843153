"""Deadlines in the Commands layer (SPEC §11): armed with the task, fired in one
transaction, at most once, never after the answer; ``wake`` leaves the task open and its
result still arrives once (G1, G3); ``cancel`` is ``task_cancel`` with reason deadline.

The test plays the timer: ``deadline_due`` is what the runtime calls when it is time.
"""

from __future__ import annotations

import pytest
from tether_world import World

from tether.domain.records import Item, Link, Message, Run
from tether.domain.types import Delivery, ItemKind, ItemStatus, RunStatus, TaskStatus, Trigger
from tether.errors import Invalid
from tether.types import ADMIN


def deadline_notices(world: World, thread_id: str) -> list[Message]:
    return [m for m in world.messages(thread_id) if (m.source or {}).get("kind") == Trigger.TASK_DEADLINE]


def task_item(world: World, parent_id: str, task_id: str) -> Item:
    [item] = [i for i in world.items(parent_id) if i.task_id == task_id]
    return item


def outbox(world: World) -> list[tuple[str, dict]]:
    with world.store.transaction() as tx:
        return [(r.kind, r.payload) for r in tx.outbox(10_000)]


def test_a_deadline_is_stored_with_the_task_and_armed_on_its_item(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, _ = world.delegate(parent_id, deadline_ms=2000)
    task = world.task(task_id)
    assert task.deadline_at is not None and task.on_deadline == "wake" and not task.overdue
    item = task_item(world, parent_id, task_id)
    assert item.due_at == task.deadline_at
    assert ("timer.arm", {"itemId": item.id}) in outbox(world)


def test_a_task_without_a_deadline_arms_nothing(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, _ = world.delegate(parent_id)
    assert world.task(task_id).deadline_at is None
    assert task_item(world, parent_id, task_id).due_at is None
    assert not [row for row in outbox(world) if row[0] == "timer.arm"]


def test_the_environment_default_applies_to_tasks_without_a_deadline(world: World) -> None:
    world.commands.default_deadline_ms = 60_000
    parent_id, _ = world.parent()
    defaulted, _ = world.delegate(parent_id)
    own, _ = world.delegate(parent_id, deadline_ms=1000)
    created = world.task(defaulted).created_at
    assert world.task(defaulted).deadline_at > created
    assert world.task(own).deadline_at < world.task(defaulted).deadline_at


@pytest.mark.parametrize(
    ("deadline_ms", "on_deadline", "message"),
    [
        (0, None, "deadlineMs must be a whole number"),
        (-1, "wake", "deadlineMs must be a whole number"),
        (1000, "later", "onDeadline must be 'wake' or 'cancel'"),
    ],
)
def test_a_bad_deadline_is_refused_and_changes_nothing(
    world: World, deadline_ms: int, on_deadline: str | None, message: str
) -> None:
    parent_id, _ = world.parent()
    before = world.dump()
    with pytest.raises(Invalid, match=message):
        world.delegate(parent_id, deadline_ms=deadline_ms, on_deadline=on_deadline)
    with pytest.raises(Invalid, match=message):
        world.commands.delegate_remote(
            world.as_thread(parent_id), "env_b", "x", deadline_ms=deadline_ms, on_deadline=on_deadline
        )
    assert world.dump() == before


def test_wake_tells_the_parent_once_and_the_result_still_arrives_once(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id, title="suite", deadline_ms=1000)
    world.end(parent_id, "delegated")
    command = world.command(child_id, awaited=True, label="b1")
    world.end(child_id, "WAITING")
    item = task_item(world, parent_id, task_id)

    world.commands.deadline_due(item.id)

    [notice] = deadline_notices(world, parent_id)
    assert notice.source["taskId"] == task_id and notice.role == "notification"
    assert f"task {task_id} \"suite\"" in notice.text
    assert "status: running; workState: waiting_background" in notice.text
    assert "latest interim: WAITING" in notice.text
    assert "command b1 `sleep 5`" in notice.text
    [run] = [r for r in world.runs(parent_id) if r.kind == Trigger.TASK_DEADLINE]
    assert run.trigger["messageIds"] == [notice.id] and run.trigger["taskId"] == task_id
    task = world.task(task_id)
    assert task.is_open and task.overdue and task.delivery_state == Delivery.PENDING
    assert task_item(world, parent_id, task_id).due_at is None, "disarmed once fired"

    before = world.dump()
    world.commands.deadline_due(item.id)  # the timer again (a restart, a duplicate row)
    assert world.dump() == before

    world.end(parent_id, "noted")
    world.commands.process_ended(command, 0)
    world.end(child_id, "FINAL")
    task = world.task(task_id)
    assert task.status == TaskStatus.COMPLETED and task.result["text"] == "FINAL"
    assert [m.text.count("FINAL") for m in world.wake_messages(parent_id)] == [1]
    assert len(deadline_notices(world, parent_id)) == 1


def test_an_answer_before_the_deadline_means_it_never_fires(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id, deadline_ms=1000)
    item = task_item(world, parent_id, task_id)
    world.end(child_id, "FINAL")
    assert world.task(task_id).status == TaskStatus.COMPLETED
    assert world.item(item.id).status == ItemStatus.ENDED
    before = world.dump()
    world.commands.deadline_due(item.id)
    assert world.dump() == before
    assert not world.task(task_id).overdue and deadline_notices(world, parent_id) == []


def test_cancel_cancels_the_task_stops_the_child_and_wakes_the_parent_once(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id, deadline_ms=1000, on_deadline="cancel")
    world.end(parent_id, "delegated")
    command = world.command(child_id, awaited=True)
    world.end(child_id, "WAITING")

    world.commands.deadline_due(task_item(world, parent_id, task_id).id)

    task = world.task(task_id)
    assert (task.status, task.cancel_reason, task.overdue) == (TaskStatus.CANCELLED, "deadline", True)
    stopped = world.item(command)
    assert (stopped.status, stopped.reason) == (ItemStatus.CANCELLED, "deadline")
    assert ("process.kill", {"itemId": command}) in outbox(world)
    assert world.thread(child_id).cancelled
    [wake] = world.wake_messages(parent_id)
    assert wake.text == f"[task {task_id}: cancelled]\n(no reply)"
    assert deadline_notices(world, parent_id) == [], "cancel wakes with the cancelled result only"
    assert world.running(child_id) is None, "the child's run was stopped too"


def test_a_remote_task_s_deadline_fires_on_the_origin_and_names_the_link(world: World) -> None:
    with world.store.transaction() as tx:
        tx.put(Link("env_b", "laptop", "http://b", "t", "2026-12-03T08:00:00.000Z", status="unreachable",
                    last_error="ConnectError: refused"))
    parent_id, _ = world.parent()
    view = world.commands.delegate_remote(world.as_thread(parent_id), "env_b", "x", deadline_ms=1000)
    world.commands.deadline_due(task_item(world, parent_id, view["taskId"]).id)
    [notice] = deadline_notices(world, parent_id)
    assert "link to laptop: unreachable (ConnectError: refused)" in notice.text
    assert world.task(view["taskId"]).is_open


def test_a_remote_task_s_cancel_deadline_is_pushed_to_the_peer(world: World) -> None:
    parent_id, _ = world.parent()
    view = world.commands.delegate_remote(
        world.as_thread(parent_id), "env_b", "x", deadline_ms=1000, on_deadline="cancel"
    )
    world.commands.remote_sent(view["taskId"], "thr_remote")
    world.commands.deadline_due(task_item(world, parent_id, view["taskId"]).id)
    task = world.task(view["taskId"])
    assert (task.status, task.remote_pending, task.cancel_reason) == ("cancelled", "cancel", "deadline")
    assert ("peer.push", {"environmentId": "env_b"}) in outbox(world)
    assert len(world.wake_messages(parent_id)) == 1


def test_a_deadline_that_fired_survives_in_the_task_view(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, _ = world.delegate(parent_id, deadline_ms=1000)
    world.commands.deadline_due(task_item(world, parent_id, task_id).id)
    view = world.queries.task(ADMIN, task_id)
    assert view["overdue"] is True and view["onDeadline"] == "wake" and view["deadlineAt"]
    assert view["status"] in ("queued", "running")


def test_deadline_runs_are_their_own_and_never_fold(world: World) -> None:
    parent_id, _ = world.parent()
    first, _ = world.delegate(parent_id, deadline_ms=1000)
    second, _ = world.delegate(parent_id, deadline_ms=1000)
    for task_id in (first, second):
        world.commands.deadline_due(task_item(world, parent_id, task_id).id)
    runs: list[Run] = [r for r in world.runs(parent_id) if r.kind == Trigger.TASK_DEADLINE]
    assert sorted(r.trigger["taskId"] for r in runs) == sorted([first, second])
    assert all(r.status == RunStatus.QUEUED for r in runs)


def test_a_deadline_item_is_only_a_task_item(world: World) -> None:
    parent_id, _ = world.parent()
    schedule = world.schedule(parent_id)
    before = world.dump()
    world.commands.deadline_due(schedule)  # not a task's item: nothing to do
    world.commands.deadline_due("bg_unknown")
    assert world.dump() == before
    assert world.item(schedule).kind == ItemKind.SCHEDULE
