"""Scenario tests of the Commands layer: G1-G4, cancel, recover and G9.

The test plays the provider: runs start inside commands (``running`` + an outbox row)
and the test ends them with ``end_run`` or acts during them as the thread. The
``world`` fixture re-checks the whole store after every commit (see ``tether_world``).
"""

from __future__ import annotations

from typing import Any

import pytest
from tether_world import World

from tether.domain import tasks as task_rules
from tether.domain.records import Item, Message, Run, Task, Thread
from tether.domain.types import Delivery, ItemKind, ItemStatus, RunStatus, TaskStatus, Trigger, WorkState
from tether.engine.delegation import Handover
from tether.errors import Conflict, Forbidden, Invalid, NotFound, TetherError
from tether.types import ADMIN, Caller


def kinds(runs: list[Run]) -> list[tuple[str, str]]:
    return [(r.kind, r.status) for r in runs]


def count(world: World, cls: type) -> int:
    with world.store.transaction() as tx:
        return tx.count(cls)


# ============================================================================ basics


def test_create_thread_starts_its_first_run_synchronously(world: World) -> None:
    made = world.commands.create_thread(ADMIN, "script", title="t", message="hello")
    run = world.run(made["runId"])
    assert run.status == RunStatus.RUNNING and run.kind == Trigger.USER and run.started_at
    thread = world.thread(made["threadId"])
    assert (thread.status, thread.settled, thread.run_count, thread.message_count) == ("running", False, 1, 1)
    with world.store.transaction() as tx:
        assert [(r.kind, r.payload) for r in tx.outbox()] == [("run.execute", {"runId": run.id})]
    world.end(thread.id, "hi")
    thread = world.thread(thread.id)
    assert (thread.status, thread.settled) == ("idle", True)


def test_create_thread_without_a_message_has_no_run(world: World) -> None:
    made = world.commands.create_thread(ADMIN, "script")
    assert made["runId"] is None
    assert world.runs(made["threadId"]) == []


def test_unknown_provider_is_refused_and_changes_nothing(world: World) -> None:
    before = world.dump()
    with pytest.raises(Invalid):
        world.commands.create_thread(ADMIN, "nope", message="x")
    assert world.dump() == before


def test_runs_queue_in_order_one_at_a_time(world: World) -> None:
    thread_id, _first = world.parent()
    a = world.commands.post_message(ADMIN, thread_id, "a")
    b = world.commands.post_message(ADMIN, thread_id, "b")
    assert (a["delivery"], b["delivery"]) == ("queued", "queued")
    assert kinds(world.runs(thread_id)) == [("user", "running"), ("user", "queued"), ("user", "queued")]
    world.end(thread_id, "1")
    assert world.running(thread_id).id == a["runId"]
    world.end(thread_id, "2")
    assert world.running(thread_id).id == b["runId"]
    world.end(thread_id, "3")
    assert world.runs(thread_id, status=[RunStatus.QUEUED, RunStatus.RUNNING]) == []
    c = world.commands.post_message(ADMIN, thread_id, "c")
    assert c["delivery"] == "started"


def test_a_now_message_stops_the_running_run_and_goes_ahead_of_queued_ones(world: World) -> None:
    thread_id, first = world.parent()
    later = world.commands.post_message(ADMIN, thread_id, "later", "queue")
    urgent = world.commands.post_message(ADMIN, thread_id, "urgent", "now")
    assert urgent["stoppedRuns"] == [first] and urgent["delivery"] == "started"
    assert world.run(first).status == RunStatus.INTERRUPTED
    assert world.running(thread_id).id == urgent["runId"]  # not the earlier queued "later"
    world.end(thread_id, "heard urgent")
    assert world.running(thread_id).id == later["runId"]


def test_a_now_message_to_a_working_child_leaves_its_task_to_the_new_answer(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id)
    world.commands.post_message(ADMIN, child_id, "do this instead", "now")
    world.end(child_id, "DONE")
    task = world.task(task_id)
    assert (task.status, task.result["text"]) == (TaskStatus.COMPLETED, "DONE")


def test_an_unknown_message_mode_is_refused_and_changes_nothing(world: World) -> None:
    thread_id, _ = world.parent()
    before = world.dump()
    with pytest.raises(Invalid):
        world.commands.post_message(ADMIN, thread_id, "x", "soon")
    assert world.dump() == before


def test_end_run_of_an_ended_run_is_a_no_op(world: World) -> None:
    _thread_id, run_id = world.parent()
    world.commands.end_run(run_id, RunStatus.COMPLETED, "first")
    before = world.dump()
    world.commands.end_run(run_id, RunStatus.FAILED, "second")
    assert world.dump() == before
    assert world.run(run_id).reply == "first"


def test_tools_of_an_ended_run_are_refused(world: World) -> None:
    thread_id, run_id = world.parent()
    world.end(thread_id, "done")
    late = Caller("thread", thread_id=thread_id, run_id=run_id)
    before = world.dump()
    for act in (
        lambda: world.commands.delegate(late, "x"),
        lambda: world.commands.start_process(late, "command", "ls"),
        lambda: world.commands.schedule(late, 10, "x"),
        lambda: world.commands.say(late, "x"),
    ):
        with pytest.raises(Conflict):
            act()
    assert world.dump() == before


# ============================================================================ delegation


def test_delegate_creates_task_child_and_held_item_in_one_go(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id, "build it", title="build")
    task = world.task(task_id)
    assert (task.parent_thread_id, task.child_thread_id, task.title) == (parent_id, child_id, "build")
    assert task.status == TaskStatus.RUNNING, "the child's first run started in the same transaction"
    child = world.thread(child_id)
    assert child.parent == {"environmentId": "env_test", "threadId": parent_id, "taskId": task_id}
    assert (child.root_task_id, child.open_task_id, child.latest_task_id) == (task_id, task_id, task_id)
    assert kinds(world.runs(child_id)) == [(Trigger.TASK, RunStatus.RUNNING)]
    assert [m.text for m in world.messages(child_id)] == ["build it"]
    [item] = world.items(parent_id, kind=ItemKind.TASK)
    assert (item.task_id, item.hold, item.held) == (task_id, True, True)


@pytest.mark.parametrize("environment_id", [None, "env_test", "env_b"])
@pytest.mark.parametrize("task", ["", "  \n"])
def test_an_empty_task_is_refused_here_and_to_a_link_and_changes_nothing(
    world: World, environment_id: str | None, task: str
) -> None:
    """One ``delegate`` for both sides: a remote delegation takes the same checks."""
    parent_id, _ = world.parent()
    before = world.dump()
    with pytest.raises(Invalid, match="task must not be empty"):
        world.commands.delegate(world.as_thread(parent_id), task, environment_id=environment_id)
    with pytest.raises(Invalid, match="task must not be empty"):
        world.commands.delegate_remote(world.as_thread(parent_id), "env_b", task)
    assert world.dump() == before


def test_delegate_returns_the_committed_task(world: World) -> None:
    parent_id, _ = world.parent()
    view = world.commands.delegate(world.as_thread(parent_id), "job", provider="script")
    assert view["status"] == world.task(view["taskId"]).status


def test_a_parent_finds_and_cancels_its_task_by_its_label(world: World) -> None:
    """A label names a task for the thread that delegated it (the latest task it gave that
    label), in place of its id; nobody else can use it, and a bad label changes nothing."""
    parent_id, _ = world.parent()
    first, _ = world.delegate(parent_id, label="build")
    again, _ = world.delegate(parent_id, label="build")
    other_id, _ = world.parent("another parent")
    before = world.dump()
    assert world.queries.task(world.as_thread(parent_id), "build")["taskId"] == again != first
    assert world.queries.task(world.as_thread(parent_id), first)["label"] == "build"
    for stranger in (world.as_thread(other_id), ADMIN):
        with pytest.raises(NotFound):
            world.queries.task(stranger, "build")
    for bad in ("", " build", "x" * 201):
        with pytest.raises(Invalid, match="label"):
            world.commands.delegate(world.as_thread(parent_id), "job", label=bad)
    assert world.dump() == before
    assert world.commands.cancel_task(world.as_thread(parent_id), "build")["taskId"] == again
    assert world.task(again).status == TaskStatus.CANCELLED and world.task(first).is_open


@pytest.mark.parametrize("hold", [True, False])
def test_hold_false_tasks_do_not_hold_the_parent(world: World, hold: bool) -> None:
    parent_id, _ = world.parent()
    world.end(parent_id, "delegating later")
    world.delegate(parent_id, hold=hold)
    assert world.thread(parent_id).settled is not hold


# ============================================================================ G1


def test_g1_interim_is_not_the_result_when_the_child_awaits_a_command(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id)
    world.command(child_id, awaited=True, label="suite")
    world.end(child_id, "WAITING")
    task = world.task(task_id)
    assert (task.status, task.work_state, task.interim, task.result) == (
        TaskStatus.RUNNING, WorkState.WAITING_BACKGROUND, "WAITING", None)
    assert world.wake_messages(parent_id) == []


def test_g1_a_later_answer_after_completion_opens_exactly_one_follow_up(world: World) -> None:
    parent_id, _ = world.parent()
    world.end(parent_id, "delegated")
    task_id, child_id = world.delegate(parent_id)
    bg = world.command(child_id, awaited=False)  # not held: the task may complete at once
    world.end(child_id, "WAITING")
    task = world.task(task_id)
    assert task.status == TaskStatus.COMPLETED
    assert task.result["text"] == "WAITING"
    assert world.thread(child_id).open_task_id is None

    world.commands.process_ended(bg, 0)
    [root, follow] = world.tasks_of_child(child_id)
    assert root.id == task_id
    assert follow.follow_up_of == task_id and follow.status == TaskStatus.RUNNING
    assert world.task(task_id).follow_ups == [follow.id]
    assert world.thread(child_id).open_task_id == follow.id
    world.end(child_id, "FINAL")
    follow = world.task(follow.id)
    assert follow.status == TaskStatus.COMPLETED and follow.result["text"] == "FINAL"
    assert len(world.tasks_of_child(child_id)) == 2, "exactly one follow-up"
    texts = [m.text for m in world.wake_messages(parent_id)]
    assert len(texts) == 2
    assert texts[0] == f"[task {task_id}: completed]\nWAITING"
    assert texts[1] == f"[follow-up of {task_id} {follow.id}: completed]\nFINAL"
    assert world.thread(child_id).open_task_id is None


def test_g1_last_non_progress_run_of_the_stretch_is_the_result(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id)
    world.schedule(child_id, "s1", hold=True)
    world.schedule(child_id, "s2", hold=True)
    [s1, s2] = [i.id for i in world.items(child_id, kind=ItemKind.SCHEDULE)]
    world.end(child_id, "first")
    world.commands.schedule_due(s1)
    world.end(child_id, "second")
    assert world.task(task_id).interim == "second"
    assert world.task(task_id).is_open
    world.commands.schedule_due(s2)
    world.end(child_id, None)  # the last run wrote no reply
    task = world.task(task_id)
    assert task.status == TaskStatus.COMPLETED
    assert task.result["text"] is None and task.interim == "second"
    assert task.result["runId"] == world.runs(child_id)[-1].id
    [wake] = world.wake_messages(parent_id)
    assert wake.text == f"[task {task_id}: completed]\n(no reply)"
    assert "first" not in wake.text and "second" not in wake.text


def test_g1_a_failed_last_run_fails_the_task(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id)
    run_id = world.end(child_id, None, RunStatus.FAILED)
    task = world.task(task_id)
    assert task.status == TaskStatus.FAILED
    assert task.result == {"text": None, "runId": run_id, "status": "failed"}
    assert world.wake_messages(parent_id)[0].text == f"[task {task_id}: failed]\n(no reply)"


@pytest.mark.parametrize("hold", [True, False])
def test_g1_scheduled_wakes_count(world: World, hold: bool) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id)
    sched = world.schedule(child_id, "look again", hold=hold)
    world.end(child_id, "WAITING")
    assert world.task(task_id).is_open is hold
    world.commands.schedule_due(sched)
    [scheduled] = [r for r in world.runs(child_id) if r.kind == Trigger.SCHEDULED]
    assert scheduled.status == RunStatus.RUNNING
    assert [m.text for m in world.messages_of(scheduled.id)] == ["look again"]
    world.end(child_id, "FINAL")
    answered = world.task(task_id) if hold else world.tasks_of_child(child_id)[-1]
    assert answered.result["text"] == "FINAL"
    assert len(world.tasks_of_child(child_id)) == (1 if hold else 2)


def test_g1_messages_count_and_a_send_while_open_opens_no_follow_up(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id)
    world.command(child_id, awaited=True)
    world.end(child_id, "WAITING")
    world.commands.post_message(world.as_thread(parent_id), child_id, "how is it going?")
    assert [t.id for t in world.tasks_of_child(child_id)] == [task_id]
    [message_run] = [r for r in world.runs(child_id) if r.kind == Trigger.MESSAGE]
    assert message_run.status == RunStatus.RUNNING
    world.end(child_id, "still going")
    assert world.task(task_id).is_open, "the awaited command still holds the child"
    assert world.task(task_id).interim == "still going"


def test_g1_a_send_after_completion_opens_a_follow_up_at_once(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id)
    world.end(child_id, "done")
    world.end(parent_id, "ok")
    world.end(parent_id, "read the result")  # the wake run
    sent = world.commands.post_message(world.as_thread(parent_id), child_id, "one more thing")
    [_, follow] = world.tasks_of_child(child_id)
    assert follow.follow_up_of == task_id and follow.is_open
    assert world.thread(child_id).open_task_id == follow.id
    assert world.run(sent["runId"]).kind == Trigger.MESSAGE
    world.end(child_id, "answer to one more thing")
    follow = world.task(follow.id)
    assert follow.result["text"] == "answer to one more thing"
    assert len(world.tasks_of_child(child_id)) == 2


def test_g1_a_user_message_after_completion_opens_a_follow_up_when_its_run_starts(world: World) -> None:
    parent_id, _ = world.parent()
    _task_id, child_id = world.delegate(parent_id)
    world.end(child_id, "done")
    world.commands.post_message(ADMIN, child_id, "from a person")
    [_, follow] = world.tasks_of_child(child_id)
    assert follow.status == TaskStatus.RUNNING
    world.end(child_id, "for the person")
    assert world.task(follow.id).result["text"] == "for the person"


def test_g1_a_nested_answer_flows_up_through_the_childs_wake_run(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id)
    nested_id, grandchild_id = world.delegate(child_id, hold=True)
    world.end(child_id, "WAITING FOR GRANDCHILD")
    assert world.thread(child_id).settled is False, "an open hold task keeps the child unsettled"
    assert world.task(task_id).work_state == WorkState.WAITING_BACKGROUND
    world.end(grandchild_id, "DEEP RESULT")
    wake = world.running(child_id)
    assert wake.kind == Trigger.DELEGATED_TASK and wake.trigger["taskIds"] == [nested_id]
    assert "DEEP RESULT" in world.messages_of(wake.id)[0].text
    assert world.task(task_id).is_open
    world.end(child_id, "CHILD SAW: DEEP RESULT")
    assert world.task(nested_id).delivery_state == Delivery.ACKNOWLEDGED
    assert world.task(task_id).result["text"] == "CHILD SAW: DEEP RESULT"
    [top] = world.wake_messages(parent_id)
    assert "DEEP RESULT" in top.text and "WAITING" not in top.text


def test_g1_at_most_one_follow_up_open_however_many_runs(world: World) -> None:
    parent_id, _ = world.parent()
    _task_id, child_id = world.delegate(parent_id)
    world.end(child_id, "done")
    world.commands.post_message(ADMIN, child_id, "a")
    world.commands.post_message(ADMIN, child_id, "b")
    world.commands.post_message(world.as_thread(parent_id), child_id, "c")
    assert sum(t.is_open for t in world.tasks_of_child(child_id)) == 1
    for reply in ("ra", "rb", "rc"):
        world.end(child_id, reply)
        assert sum(t.is_open for t in world.tasks_of_child(child_id)) <= 1
    [_, follow] = world.tasks_of_child(child_id)
    assert follow.result["text"] == "rc"


# ============================================================================ G2


def test_g2_item_end_and_wake_run_are_one_transaction(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id)
    bg = world.command(child_id, awaited=True, label="tests")
    world.end(child_id, "WAITING")
    assert world.thread(child_id).settled is False

    seen: list[tuple[bool, list[tuple[str, str]], str, str]] = []
    original = world._committed

    def spy(touched: set[str]) -> None:
        original(touched)
        seen.append((world.thread(child_id).settled, kinds(world.runs(child_id)),
                     world.item(bg).status, world.task(task_id).status))

    world.commands._on_commit = spy
    world.commands.process_ended(bg, 0, tail="5 passed")
    assert len(seen) == 1, "one command, one commit"
    settled, runs, item_status, task_status = seen[0]
    assert item_status == ItemStatus.ENDED
    assert settled is False
    assert runs[-1][0] == Trigger.BACKGROUND_COMMAND
    assert runs[-1][1] in (RunStatus.QUEUED, RunStatus.RUNNING)
    assert task_status == TaskStatus.RUNNING
    [bg_run] = [r for r in world.runs(child_id) if r.kind == Trigger.BACKGROUND_COMMAND]
    [notice] = world.messages_of(bg_run.id)
    assert notice.role == "notification"
    assert notice.text == "Background command tests `sleep 5` exited with code 0.\n5 passed"
    assert notice.source == {"kind": "background_command", "itemId": bg, "label": "tests", "exitCode": 0}
    world.end(child_id, "FINAL: 5 passed")
    assert world.task(task_id).result["text"] == "FINAL: 5 passed"


@pytest.mark.parametrize("case", ["awaited", "monitor", "hold-schedule"])
def test_g2_held_work_keeps_the_task_open_until_its_wake_run_answers(world: World, case: str) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id)
    if case == "awaited":
        item = world.command(child_id)
        world.commands.background_wait(world.as_thread(child_id), item)
    elif case == "monitor":
        item = world.monitor(child_id, persistent=False)
    else:
        item = world.schedule(child_id, hold=True)
    world.end(child_id, "WAITING")
    assert world.task(task_id).work_state == WorkState.WAITING_BACKGROUND
    assert world.thread(child_id).settled is False
    if case == "hold-schedule":
        world.commands.schedule_due(item)
    else:
        world.commands.process_ended(item, 0)
    assert world.task(task_id).is_open
    assert world.task(task_id).work_state == WorkState.WORKING
    world.end(child_id, "FINAL")
    assert world.task(task_id).result["text"] == "FINAL"
    assert world.violations == []


@pytest.mark.parametrize("case", ["command", "persistent-monitor", "schedule"])
def test_g2_work_that_is_not_held_lets_the_child_settle(world: World, case: str) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id)
    if case == "command":
        world.command(child_id, awaited=False)
    elif case == "persistent-monitor":
        world.monitor(child_id, persistent=True)
    else:
        world.schedule(child_id, hold=False)
    world.end(child_id, "WAITING")
    assert world.thread(child_id).settled is True
    assert world.task(task_id).result["text"] == "WAITING"


def test_g2_background_wait_by_label_and_refusals(world: World) -> None:
    parent_id, _ = world.parent()
    _task_id, child_id = world.delegate(parent_id)
    world.command(child_id, label="build")
    mon = world.monitor(child_id)
    waited = world.commands.background_wait(world.as_thread(child_id), "build")
    assert waited["awaited"] is True and waited["held"] is True
    before = world.dump()
    with pytest.raises(Invalid):
        world.commands.background_wait(world.as_thread(child_id), mon)
    with pytest.raises(NotFound):
        world.commands.background_wait(world.as_thread(child_id), "nope")
    assert world.dump() == before


# ============================================================================ G3


def test_g3_results_completing_while_a_wake_is_queued_fold_into_it(world: World) -> None:
    parent_id, _ = world.parent()  # the parent's run stays running: wakes must queue
    a, child_a = world.delegate(parent_id, "job a")
    b, child_b = world.delegate(parent_id, "job b")
    world.end(child_a, "RESULT A")
    world.end(child_b, "RESULT B")
    [wake_run] = world.wake_runs(parent_id)
    assert wake_run.status == RunStatus.QUEUED
    assert wake_run.trigger["taskIds"] == [a, b]
    [message] = world.wake_messages(parent_id)
    assert world.messages_of(wake_run.id) == [message]
    assert message.source == {"kind": "delegated_task", "taskIds": [a, b]}
    assert message.text == task_rules.wake_text([world.task(a), world.task(b)])
    assert message.text.count("RESULT A") == 1 and message.text.count("RESULT B") == 1
    for task_id in (a, b):
        task = world.task(task_id)
        assert (task.delivery_state, task.wake_run_id, task.wake_message_id, task.delivered_as) == (
            Delivery.CLAIMED, wake_run.id, message.id, "result")
    world.end(parent_id, "first turn over")
    assert world.run(wake_run.id).status == RunStatus.RUNNING
    assert {world.task(t).delivery_state for t in (a, b)} == {Delivery.DELIVERED}
    world.end(parent_id, "read both")
    assert {world.task(t).delivery_state for t in (a, b)} == {Delivery.ACKNOWLEDGED}


def test_g3_a_result_while_the_wake_run_is_running_gets_the_next_wake(world: World) -> None:
    parent_id, _ = world.parent()
    a, child_a = world.delegate(parent_id)
    b, child_b = world.delegate(parent_id)
    c, child_c = world.delegate(parent_id)
    world.end(parent_id, "waiting for children")
    world.end(child_a, "A")
    [first] = world.wake_runs(parent_id)
    assert first.status == RunStatus.RUNNING
    world.end(child_b, "B")
    world.end(child_c, "C")
    [first, second] = world.wake_runs(parent_id)
    assert first.trigger["taskIds"] == [a]
    assert second.trigger["taskIds"] == [b, c] and second.status == RunStatus.QUEUED
    assert world.task(a).delivery_state == Delivery.DELIVERED
    assert world.task(b).delivery_state == Delivery.CLAIMED
    world.end(parent_id, "saw A")
    world.end(parent_id, "saw B and C")
    assert {world.task(t).delivery_state for t in (a, b, c)} == {Delivery.ACKNOWLEDGED}
    listed = [t for m in world.wake_messages(parent_id) for t in m.source["taskIds"]]
    assert sorted(listed) == sorted([a, b, c])


def test_g3_a_duplicate_process_end_changes_nothing(world: World) -> None:
    parent_id, _ = world.parent()
    _task_id, child_id = world.delegate(parent_id)
    bg = world.command(child_id, awaited=True)
    world.end(child_id, "WAITING")
    world.commands.process_ended(bg, 0)
    before = world.dump()
    world.commands.process_ended(bg, 0)
    world.commands.process_ended(bg, 1, lines=["late"], reason="killed")
    assert world.dump() == before
    world.end(child_id, "FINAL")
    before = world.dump()
    world.commands.process_ended(bg, 0)
    assert world.dump() == before
    assert len(world.wake_messages(parent_id)) == 1


def test_g3_duplicate_schedule_due_and_monitor_output_after_end_change_nothing(world: World) -> None:
    parent_id, _ = world.parent()
    _task_id, child_id = world.delegate(parent_id)
    sched = world.schedule(child_id, hold=True)
    mon = world.monitor(child_id)
    world.end(child_id, "WAITING")
    world.commands.schedule_due(sched)
    world.commands.process_ended(mon, 0)
    before = world.dump()
    world.commands.schedule_due(sched)
    world.commands.monitor_output(mon, ["late line"], 99)
    assert world.dump() == before


def test_g3_wait_mode_result_goes_to_the_call_and_wakes_nobody(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id, mode="wait")
    world.end(child_id, "ANSWER")
    task = world.task(task_id)
    assert (task.delivery_state, task.delivered_as) == (Delivery.CLAIMED, "call")
    assert world.wake_messages(parent_id) == []
    view = world.commands.end_wait(task_id)
    assert view is not None and view["result"]["text"] == "ANSWER"
    assert world.task(task_id).delivery_state == Delivery.ACKNOWLEDGED
    assert world.wake_messages(parent_id) == []


def test_g3_a_timed_out_wait_gets_its_wake_later(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id, mode="wait")
    world.command(child_id, awaited=True)
    world.end(child_id, "WAITING")
    assert world.commands.end_wait(task_id) is None  # timed out: the task goes on
    [bg] = [i.id for i in world.items(child_id)]
    world.commands.process_ended(bg, 0)
    world.end(child_id, "LATE ANSWER")
    [wake] = world.wake_messages(parent_id)
    assert "LATE ANSWER" in wake.text
    assert world.task(task_id).delivered_as == "result"


# ============================================================================ G4


def test_g4_monitor_events_are_progress_not_answers(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id)
    mon = world.monitor(child_id, persistent=False, label="log")
    world.end(child_id, "WAITING")
    world.commands.monitor_output(mon, ["10%"], 4)
    progress_run = world.running(child_id)
    assert progress_run.kind == Trigger.MONITOR_EVENT and progress_run.is_progress
    assert [m.text for m in world.messages_of(progress_run.id)] == ["10%"]
    assert world.thread(child_id).settled is False, "the monitor itself is held"
    world.end(child_id, "PROGRESS 10")
    task = world.task(task_id)
    assert task.interim == "WAITING", "a progress reply is not an interim"
    assert [p["text"] for p in task.progress] == ["PROGRESS 10"]
    assert task.progress[0]["runId"] == progress_run.id
    assert world.item(mon).offset == 4 and world.item(mon).last_line == "10%"
    world.commands.process_ended(mon, 0)
    world.end(child_id, "DONE")
    task = world.task(task_id)
    assert task.result["text"] == "DONE"
    assert all("PROGRESS" not in m.text for m in world.wake_messages(parent_id))


def test_g4_progress_runs_open_no_follow_up_and_do_not_unsettle(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id)
    mon = world.monitor(child_id, persistent=True)
    world.end(child_id, "DONE")
    assert world.task(task_id).status == TaskStatus.COMPLETED
    wakes = len(world.wake_messages(parent_id))
    for n in range(3):
        world.commands.monitor_output(mon, [f"line {n}"], n)
        assert world.thread(child_id).settled is True
        assert world.thread(child_id).status == "running"
        world.end(child_id, f"progress {n}")
    assert [t.id for t in world.tasks_of_child(child_id)] == [task_id]
    task = world.task(task_id)
    assert [p["text"] for p in task.progress] == ["progress 0", "progress 1", "progress 2"]
    assert task.result["text"] == "DONE"
    assert len(world.wake_messages(parent_id)) == wakes
    assert world.thread(child_id).pending_answer_run_id is None


def test_g4_lines_while_a_run_is_active_fold_into_one_queued_progress_run(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id)
    mon = world.monitor(child_id, persistent=True)
    other = world.monitor(child_id, persistent=True)
    for n in range(3):
        world.commands.monitor_output(mon, [f"a{n}"], n)
    world.commands.monitor_output(other, ["b0"], 0)
    queued = world.queued(child_id)
    assert kinds(queued) == [(Trigger.MONITOR_EVENT, RunStatus.QUEUED)] * 2
    assert [m.text for m in world.messages_of(queued[0].id)] == ["a0", "a1", "a2"]
    assert [m.text for m in world.messages_of(queued[1].id)] == ["b0"]
    assert world.task(task_id).is_open


def test_g4_monitor_end_turns_unhandled_lines_into_its_finished_run(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id)
    mon = world.monitor(child_id, persistent=False)
    world.commands.monitor_output(mon, ["line 1"], 1)  # queued behind the task run
    world.commands.process_ended(mon, 0, lines=["line 2"], offset=2)
    runs = world.runs(child_id)
    assert all(r.kind != Trigger.MONITOR_EVENT for r in runs), "no progress run left for this monitor"
    finished = [r for r in runs if r.kind == Trigger.MONITOR_FINISHED]
    texts = [m.text for r in finished for m in world.messages_of(r.id)]
    assert texts[:2] == ["line 1", "line 2"], "the monitor's output comes before its end"
    assert texts[-1].startswith("Monitor `tail -f log` ended")
    world.end(child_id, "WAITING")
    while world.running(child_id) is not None:
        world.end(child_id, "SEEN")
    assert world.task(task_id).result["text"] == "SEEN"


def test_g4_monitor_end_folds_unhandled_lines_into_one_finished_run(world: World) -> None:
    parent_id, _ = world.parent()
    _task_id, child_id = world.delegate(parent_id)
    mon = world.monitor(child_id, persistent=False)
    world.commands.monitor_output(mon, ["line 1"], 1)
    world.commands.process_ended(mon, 0, lines=["line 2"], offset=2)
    finished = [r for r in world.runs(child_id) if r.kind == Trigger.MONITOR_FINISHED]
    assert len(finished) == 1
    texts = [m.text for m in world.messages_of(finished[0].id)]
    assert texts[:2] == ["line 1", "line 2"] and texts[2].startswith("Monitor")
    assert len(texts) == 3
    world.end(child_id, "WAITING")
    assert world.running(child_id).id == finished[0].id
    world.end(child_id, "FINAL FROM THE MONITOR")
    assert world.task(_task_id).result["text"] == "FINAL FROM THE MONITOR"


def test_g4_lines_already_handled_stay_progress_when_the_monitor_ends(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id)
    mon = world.monitor(child_id, persistent=False)
    world.end(child_id, "WAITING")
    world.commands.monitor_output(mon, ["line 1"], 1)
    progress = world.running(child_id)
    assert progress.kind == Trigger.MONITOR_EVENT
    world.commands.process_ended(mon, 0)
    assert world.run(progress.id).kind == Trigger.MONITOR_EVENT, "a started progress run stays progress"
    [finished] = world.queued(child_id)
    assert finished.kind == Trigger.MONITOR_FINISHED
    world.end(child_id, "PROGRESS")
    world.end(child_id, "DONE")
    task = world.task(task_id)
    assert task.result["text"] == "DONE" and [p["text"] for p in task.progress] == ["PROGRESS"]


def test_g4_one_monitors_end_never_takes_another_monitors_lines(world: World) -> None:
    parent_id, _ = world.parent()
    _task_id, child_id = world.delegate(parent_id)
    a = world.monitor(child_id, persistent=True)
    b = world.monitor(child_id, persistent=True)
    world.commands.monitor_output(a, ["from a"], 1)
    world.commands.monitor_output(b, ["from b"], 1)
    world.commands.process_ended(a, 0)
    queued = world.queued(child_id)
    assert [(r.kind, r.trigger["key"]) for r in queued] == [
        (Trigger.MONITOR_FINISHED, a), (Trigger.MONITOR_EVENT, b)]
    assert [m.text for m in world.messages_of(queued[1].id)] == ["from b"]


# ============================================================================ cancel


def _busy_child(world: World) -> tuple[str, str, str, dict[str, str]]:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id)
    items = {
        "command": world.command(child_id, awaited=True),
        "monitor": world.monitor(child_id, persistent=True),
        "schedule": world.schedule(child_id, hold=True),
    }
    return parent_id, task_id, child_id, items


def test_cancel_by_someone_else_stops_everything_and_wakes_the_parent_once(world: World) -> None:
    parent_id, task_id, child_id, items = _busy_child(world)
    running = world.running(child_id)
    answer = world.commands.cancel_task(ADMIN, task_id, reason="no longer needed")
    assert answer == {"taskId": task_id, "status": "cancelled"}
    task = world.task(task_id)
    assert task.status == TaskStatus.CANCELLED
    assert task.result == {"text": None, "runId": None, "status": "cancelled"}
    assert world.run(running.id).status == RunStatus.CANCELLED
    assert {world.item(i).status for i in items.values()} == {ItemStatus.CANCELLED}
    with world.store.transaction() as tx:
        rows = [(r.kind, r.payload) for r in tx.outbox(1000)]
    assert ("run.stop", {"runId": running.id}) in rows
    assert ("process.kill", {"itemId": items["command"]}) in rows
    assert ("process.kill", {"itemId": items["monitor"]}) in rows
    child = world.thread(child_id)
    assert child.cancelled and child.settled and child.open_task_id is None
    [wake] = world.wake_messages(parent_id)
    assert wake.text == f"[task {task_id}: cancelled]\n(no reply)"
    assert task.delivery_state == Delivery.CLAIMED
    [parent_item] = world.items(parent_id, kind=ItemKind.TASK)
    assert parent_item.status == ItemStatus.CANCELLED and not parent_item.held

    # later child replies open no follow-ups and wake nobody
    world.commands.end_run(running.id, RunStatus.COMPLETED, "too late")
    assert world.run(running.id).reply is None
    world.commands.post_message(world.as_thread(parent_id), child_id, "are you there?")
    world.end(child_id, "late answer")
    world.commands.post_message(ADMIN, child_id, "and you?")
    world.end(child_id, "another late answer")
    assert [t.id for t in world.tasks_of_child(child_id)] == [task_id]
    assert len(world.wake_messages(parent_id)) == 1
    assert world.task(task_id).result["text"] is None


def test_cancel_by_the_parent_disposes_the_result(world: World) -> None:
    parent_id, task_id, _child_id, _ = _busy_child(world)
    world.commands.cancel_task(world.as_thread(parent_id), task_id)
    task = world.task(task_id)
    assert task.status == TaskStatus.CANCELLED
    assert task.delivery_state == Delivery.DISPOSED
    assert world.wake_messages(parent_id) == []
    assert world.wake_runs(parent_id) == []


def test_cancel_of_a_terminal_task_changes_nothing(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id)
    world.end(child_id, "done")
    before = world.dump()
    assert world.commands.cancel_task(ADMIN, task_id) == {"taskId": task_id, "status": "completed"}
    assert world.dump() == before


def test_cancel_of_an_open_follow_up(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id)
    world.end(child_id, "done")
    world.commands.post_message(ADMIN, child_id, "more")
    [_, follow] = world.tasks_of_child(child_id)
    world.commands.cancel_task(ADMIN, follow.id)
    assert world.task(follow.id).status == TaskStatus.CANCELLED
    assert world.task(task_id).status == TaskStatus.COMPLETED
    [wake] = world.wake_messages(parent_id)  # the parent's first run still runs: both fold into one wake
    assert wake.source["taskIds"] == [task_id, follow.id]
    assert wake.text.endswith(f"{follow.id}: cancelled]\n(no reply)")


def test_cancel_cancels_open_nested_tasks(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id)
    nested_id, grandchild_id = world.delegate(child_id)
    world.commands.cancel_task(ADMIN, task_id)
    nested = world.task(nested_id)
    assert nested.status == TaskStatus.CANCELLED
    assert nested.delivery_state == Delivery.DISPOSED, "its parent (the child) was stopped: nobody to wake"
    assert world.thread(grandchild_id).cancelled
    assert world.runs(grandchild_id, status=[RunStatus.QUEUED, RunStatus.RUNNING]) == []
    assert world.wake_messages(child_id) == []
    assert len(world.wake_messages(parent_id)) == 1


def test_cancel_of_an_unknown_task_is_not_found(world: World) -> None:
    with pytest.raises(NotFound):
        world.commands.cancel_task(ADMIN, "tsk_nope")


# ============================================================================ interrupt


def test_interrupt_ends_the_running_run_and_the_task_is_interrupted(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id)
    run = world.running(child_id)
    out = world.commands.interrupt(ADMIN, child_id)
    assert out["stoppedRuns"] == [run.id]
    assert world.run(run.id).status == RunStatus.INTERRUPTED
    task = world.task(task_id)
    assert task.status == TaskStatus.INTERRUPTED
    assert task.result == {"text": None, "runId": run.id, "status": "interrupted"}


def test_stopping_a_waiting_child_interrupts_its_task(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id)
    world.command(child_id, awaited=True)
    world.end(child_id, "WAITING")
    world.commands.interrupt(ADMIN, child_id, stop=True)
    task = world.task(task_id)
    # The result is still the reply of the child's last non-progress run (SPEC §1), but
    # the task says the child was stopped rather than completed.
    assert task.status == TaskStatus.INTERRUPTED
    assert task.result["status"] == "interrupted"
    assert task.result["text"] == "WAITING"


# ============================================================================ recover (G6)


def test_recover_interrupts_running_runs_and_queues_one_restart_run_per_thread(world: World) -> None:
    parent_id, parent_run = world.parent()
    task_id, child_id = world.delegate(parent_id)
    world.commands.post_message(ADMIN, child_id, "queued behind")
    child_run = world.running(child_id).id
    restarted = world.commands.recover({}, [])
    assert sorted(restarted) == sorted([parent_id, child_id])
    assert world.run(parent_run).status == RunStatus.INTERRUPTED
    assert world.run(child_run).status == RunStatus.INTERRUPTED
    for thread_id in (parent_id, child_id):
        restarts = [r for r in world.runs(thread_id) if r.kind == Trigger.RESTART]
        assert len(restarts) == 1
    # the child's queued user run goes first (queue order), the restart after it
    assert world.running(child_id).kind == Trigger.USER
    assert world.running(parent_id).kind == Trigger.RESTART
    assert world.task(task_id).is_open
    world.end(child_id, "after user")
    world.end(child_id, "after restart")
    assert world.task(task_id).result["text"] == "after restart"
    assert world.commands.recover({}, []) == [parent_id], "only the parent's restart run is running now"


def test_recover_reports_processes_that_exited_while_down(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id)
    bg = world.command(child_id, awaited=True)
    world.end(child_id, "WAITING")
    world.commands.recover({bg: 3}, [])
    assert world.item(bg).exit_code == 3
    assert world.running(child_id).kind == Trigger.BACKGROUND_COMMAND
    world.end(child_id, "exit 3 seen")
    assert world.task(task_id).result["text"] == "exit 3 seen"


def test_recover_reports_a_lost_process_by_a_restart_run(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id)
    bg = world.command(child_id, awaited=True)
    world.end(child_id, "WAITING")
    world.commands.recover({}, [bg])
    item = world.item(bg)
    assert item.status == ItemStatus.FAILED and item.reason
    [restart] = [r for r in world.runs(child_id) if r.kind == Trigger.RESTART]
    assert restart.status == RunStatus.RUNNING
    world.end(child_id, "lost it")
    assert world.task(task_id).result["text"] == "lost it"


def test_recover_gives_a_thread_one_restart_run_even_with_lost_processes(world: World) -> None:
    thread_id, _ = world.parent()
    a = world.command(thread_id, label="a")
    b = world.command(thread_id, label="b")
    world.commands.recover({}, [a, b])
    restarts = [r for r in world.runs(thread_id) if r.kind == Trigger.RESTART]
    assert len(restarts) == 1
    texts = [m.text for m in world.messages_of(restarts[0].id)]
    assert len(texts) == 3, "the interrupted run and both lost commands, all in the one restart run"
    assert texts[0].startswith("tether restarted")
    assert {world.item(a).status, world.item(b).status} == {ItemStatus.FAILED}


def test_recover_hands_a_dead_wait_calls_result_to_a_wake(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id, mode="wait")
    world.end(child_id, "ANSWER")
    assert world.task(task_id).delivered_as == "call"
    world.commands.recover({}, [])
    task = world.task(task_id)
    assert task.delivered_as == "result" and task.delivery_state == Delivery.CLAIMED
    [wake] = world.wake_messages(parent_id)
    assert "ANSWER" in wake.text


# ============================================================================ G9


def test_g9_create_thread_is_idempotent_per_caller(world: World) -> None:
    first = world.commands.create_thread(ADMIN, "script", message="hi", client_request_id="k1")
    before = world.dump()
    again = world.commands.create_thread(ADMIN, "script", message="hi", client_request_id="k1")
    assert again == first
    assert world.dump() == before
    link = Caller("link", token_id="tok_1")
    other_scope = world.commands.create_thread(link, "script", client_request_id="k1")
    assert other_scope["threadId"] != first["threadId"]
    different_key = world.commands.create_thread(ADMIN, "script", client_request_id="k2")
    assert different_key["threadId"] != first["threadId"]
    assert count(world, Thread) == 3


def test_g9_post_message_is_idempotent(world: World) -> None:
    thread_id, _ = world.parent()
    first = world.commands.post_message(ADMIN, thread_id, "again?", client_request_id="m1")
    before = world.dump()
    again = world.commands.post_message(ADMIN, thread_id, "again?", client_request_id="m1")
    assert again == first
    assert world.dump() == before
    assert [m.text for m in world.messages(thread_id)].count("again?") == 1


def test_g9_delegate_is_idempotent(world: World) -> None:
    parent_id, _ = world.parent()
    caller = world.as_thread(parent_id)
    first = world.commands.delegate(caller, "job", provider="script", client_request_id="d1")
    before = world.dump()
    again = world.commands.delegate(caller, "job", provider="script", client_request_id="d1")
    assert again == first
    assert world.dump() == before
    # a repeat after the calling run ended still returns the first outcome (a retry)
    world.end(parent_id, "done")
    assert world.commands.delegate(caller, "job", provider="script", client_request_id="d1") == first
    assert count(world, Task) == 1 and count(world, Thread) == 2


def _handovers(*ids: str) -> list[Handover]:
    origin = {"environmentId": "env_origin", "threadId": "thr_origin"}
    return [Handover(task_id=i, text="job", origin={**origin, "taskId": i}, provider="script") for i in ids]


def _views(answers: list[dict[str, Any] | TetherError]) -> list[dict[str, Any]]:
    """The task views of accepted handovers (every one of them must be)."""
    assert all(isinstance(a, dict) for a in answers), answers
    return [a for a in answers if isinstance(a, dict)]


def test_g9_a_batch_of_handovers_is_one_commit_and_idempotent(world: World) -> None:
    """A pushed batch is accepted in one transaction; asked again, each answer is the
    first one and nothing changes."""
    link = Caller("link", token_id="tok_1")
    first = _views(world.commands.accept_tasks(link, _handovers("tsk_b0", "tsk_b1", "tsk_b2")))
    assert world.commits == 1
    assert [a["taskId"] for a in first] == ["tsk_b0", "tsk_b1", "tsk_b2"]
    assert len({a["childThreadId"] for a in first}) == 3
    before = world.dump()
    assert world.commands.accept_tasks(link, _handovers("tsk_b0", "tsk_b1", "tsk_b2")) == first
    assert world.dump() == before
    twice = _views(world.commands.accept_tasks(link, _handovers("tsk_b3", "tsk_b3")))  # one batch
    assert twice[0] == twice[1] and len(world.tasks_of_child(twice[0]["childThreadId"])) == 1


def test_g9_a_refused_handover_takes_nothing_from_the_rest_of_its_batch(world: World) -> None:
    """One refusal in a batch: the others are accepted each on its own, and the refused
    one is answered with its error, as alone."""
    link, stranger = Caller("link", token_id="tok_1"), Caller("link", token_id="tok_2")
    [theirs] = _views(world.commands.accept_tasks(stranger, _handovers("tsk_theirs")))
    answers = world.commands.accept_tasks(link, _handovers("tsk_c0", "tsk_theirs", "tsk_c1"))
    assert isinstance(answers[1], Forbidden)
    assert [a["taskId"] for a in _views([answers[0], answers[2]])] == ["tsk_c0", "tsk_c1"]
    assert world.task("tsk_theirs").child_thread_id == theirs["childThreadId"]
    assert {t.id for t in world.all_tasks()} == {"tsk_theirs", "tsk_c0", "tsk_c1"}


def test_g9_a_refused_request_is_not_remembered(world: World) -> None:
    with pytest.raises(NotFound):
        world.commands.post_message(ADMIN, "thr_nope", "x", client_request_id="r1")
    thread_id, _ = world.parent()
    done = world.commands.post_message(ADMIN, thread_id, "x", client_request_id="r1")
    assert done["runId"]


# ============================================================================ queries


def test_queries_show_the_same_state(world: World) -> None:
    parent_id, _ = world.parent()
    task_id, child_id = world.delegate(parent_id, title="job")
    world.end(child_id, "R")
    view = world.queries.thread(ADMIN, parent_id)
    assert [t["taskId"] for t in view["tasks"]] == [task_id]
    assert view["tasks"][0]["result"]["text"] == "R"
    assert world.queries.task(ADMIN, task_id)["delivery"]["state"] == "claimed"
    child_view = world.queries.thread(ADMIN, child_id)
    assert child_view["settled"] is True and child_view["taskId"] == task_id
    shown = len(world.messages(parent_id)) + len(world.messages(child_id))
    assert count(world, Message) == shown
    assert count(world, Item) == 1


def test_a_link_and_its_status_are_commands_with_events(world: World) -> None:
    """Adding a link and what its follower finds are state changes like any other: each
    one event in the feed; a status reported again unchanged writes nothing (#11)."""
    added = world.commands.add_link("env_b", "b", "http://127.0.0.1:9", "secret", None, "tether")
    world.commands.link_status("env_b", "unreachable", "ConnectError")
    world.commands.link_status("env_b", "unreachable", "ConnectError")
    again = world.commands.add_link("env_b", "b2", "http://127.0.0.1:10", "new", "lab", "tether")
    assert (added.status, again.status, again.label) == ("ok", "ok", "lab")
    assert again.created_at == added.created_at
    events = [(e.type, e.data) for e in world.store.events_after(0) if e.type.startswith("link.")]
    assert events == [
        ("link.added", {"environmentId": "env_b", "name": "b", "kind": "tether"}),
        ("link.status", {"environmentId": "env_b", "status": "unreachable", "lastError": "ConnectError"}),
        ("link.added", {"environmentId": "env_b", "name": "b2", "kind": "tether"}),
    ]
    assert "secret" not in str(events) and "new" not in str(events)  # the token never leaves the link
    assert world.commands.link_status("env_missing", "ok", None) is None
