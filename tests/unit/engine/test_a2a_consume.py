"""Consuming A2A (SPEC §14): an A2A agent's tasks applied to ours by ``Commands.apply_a2a``,
and the mapping of A2A tasks onto tether task views (``tether.peers.a2a``)."""

from __future__ import annotations

from a2a.types import a2a_pb2 as pb
from tether_world import World

from tether.peers.a2a import references, task_view

AGENT = "a2a_0123456789abcdef"
CONTEXT = "ctx-remote"


def remote(task_id: str, state: int, text: str | None = None, refs: tuple[str, ...] = ()) -> pb.Task:
    """An A2A task as an agent answers it: text as the artifact once ended, else the status."""
    task = pb.Task(id=task_id, context_id=CONTEXT)
    task.status.state = state
    task.status.message.reference_task_ids.extend(refs)
    if text is not None and state == pb.TaskState.TASK_STATE_COMPLETED:
        task.artifacts.add(artifact_id="a").parts.add(text=text)
        task.status.timestamp.FromJsonString("2026-12-03T10:00:00.250Z")
    elif text is not None:
        task.status.message.parts.add(text=text)
    return task


def delegated(world: World) -> tuple[str, str]:
    """A parent that delegated to the agent, which took the task as ``r1``: (parent, task)."""
    parent_id, _ = world.parent()
    view = world.commands.delegate_remote(world.as_thread(parent_id), AGENT, "do it")
    world.end(parent_id, "delegated")
    world.commands.remote_sent(view["taskId"], CONTEXT, "r1")
    return parent_id, view["taskId"]


def apply(world: World, task: pb.Task) -> None:
    world.commands.apply_a2a(AGENT, task.id, references(task), task_view(task))


def test_states_and_artifacts_map_onto_the_task_and_the_result_wakes_once(world: World) -> None:
    parent_id, task_id = delegated(world)
    apply(world, remote("r1", pb.TaskState.TASK_STATE_WORKING, "on it"))
    task = world.task(task_id)
    assert (task.status, task.interim, task.remote_task_id, task.child_thread_id) == (
        "running", "on it", "r1", CONTEXT)
    done = remote("r1", pb.TaskState.TASK_STATE_COMPLETED, "DONE")
    apply(world, done)
    apply(world, done)  # read again: nothing new
    task = world.task(task_id)
    assert (task.status, task.result["text"], task.completed_at) == (
        "completed", "DONE", "2026-12-03T10:00:00.250Z")
    assert len(world.wake_messages(parent_id)) == 1


def test_a_referencing_task_is_one_follow_up_with_its_own_wake(world: World) -> None:
    parent_id, task_id = delegated(world)
    apply(world, remote("r1", pb.TaskState.TASK_STATE_COMPLETED, "WAITING"))
    world.end(parent_id, "noted")
    late = remote("r2", pb.TaskState.TASK_STATE_COMPLETED, "FINAL", refs=("r1",))
    for _ in range(3):  # every read of the context finds it again
        apply(world, late)
    follow_ups = [t for t in world.all_tasks() if t.follow_up_of == task_id]
    assert [(t.remote_task_id, t.result["text"], t.delivered_as) for t in follow_ups] == [
        ("r2", "FINAL", "follow-up")]
    assert world.task(task_id).follow_ups == [follow_ups[0].id]
    assert len(world.wake_messages(parent_id)) == 2


def test_tasks_that_reference_none_of_ours_or_a_cancelled_one_open_nothing(world: World) -> None:
    parent_id, task_id = delegated(world)
    apply(world, remote("rX", pb.TaskState.TASK_STATE_COMPLETED, "stranger", refs=("r-unknown",)))
    world.commands.cancel_task(world.as_thread(parent_id, during_run=False), task_id)
    apply(world, remote("r2", pb.TaskState.TASK_STATE_COMPLETED, "FINAL", refs=("r1",)))
    assert [t.id for t in world.all_tasks()] == [task_id]


def test_failed_and_rejected_fail_with_the_agent_s_words() -> None:
    for state in (pb.TaskState.TASK_STATE_FAILED, pb.TaskState.TASK_STATE_REJECTED):
        view = task_view(remote("r1", state, "no disk left"))
        assert view["status"] == "failed" and view["result"]["error"] == "no disk left", view
    assert task_view(remote("r1", pb.TaskState.TASK_STATE_CANCELED))["status"] == "cancelled"
    assert task_view(remote("r1", pb.TaskState.TASK_STATE_INPUT_REQUIRED, "which branch?"))["interim"] == (
        "which branch?")
