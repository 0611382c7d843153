"""Delegated tasks (``tether.domain.tasks``): results, cancel, follow-ups, delivery, wake text."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.domain import tasks
from tether.domain.records import Run, Task
from tether.domain.types import Delivery, DomainError, ItemStatus, RunStatus, TaskStatus, Trigger, WorkState

AT = "2026-01-01T00:00:00.000Z"
LATER = "2026-01-01T00:00:09.000Z"
OPEN = [TaskStatus.QUEUED, TaskStatus.RUNNING]
TERMINAL = [TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.INTERRUPTED]


def make_task(status: str = TaskStatus.RUNNING, task_id: str = "tsk_1", **fields: object) -> Task:
    return Task(
        id=task_id,
        parent_environment_id="env_p",
        parent_thread_id="thr_p",
        child_environment_id="env_c",
        child_thread_id="thr_c",
        created_at=AT,
        status=status,
        **fields,  # type: ignore[arg-type]
    )


def make_run(
    status: str = RunStatus.COMPLETED, reply: str | None = "answer", kind: str = Trigger.TASK
) -> Run:
    return Run("run_9", "thr_c", 3, {"kind": str(kind), "key": None, "messageIds": []}, AT,
               status=status, reply=reply, ended_at=LATER)


# ---------------------------------------------------------------------------- status helpers


@pytest.mark.parametrize("status", list(TaskStatus))
def test_is_open_only_for_queued_and_running(status: TaskStatus) -> None:
    assert make_task(status).is_open == (status in OPEN)


@pytest.mark.parametrize("status", list(TaskStatus))
def test_mark_running_moves_only_queued(status: TaskStatus) -> None:
    task = make_task(status)
    tasks.mark_running(task)
    assert task.status == (TaskStatus.RUNNING if status == TaskStatus.QUEUED else status)


def test_note_reply_sets_the_interim_while_open() -> None:
    task = make_task()
    tasks.note_reply(task, make_run(reply="WAITING"))
    assert task.interim == "WAITING"
    tasks.note_reply(task, make_run(reply=None))
    assert task.interim == "WAITING", "a run without a reply keeps the last interim"
    tasks.note_reply(task, make_run(reply="later"))
    assert task.interim == "later"
    assert task.result is None, "an interim is never a result"


@pytest.mark.parametrize("status", TERMINAL)
def test_note_reply_leaves_a_closed_task_alone(status: TaskStatus) -> None:
    task = make_task(status, interim="old")
    tasks.note_reply(task, make_run(reply="new"))
    assert task.interim == "old"


def test_note_progress_appends_run_text_and_time() -> None:
    task = make_task()
    progress = make_run(reply="42%", kind=Trigger.MONITOR_EVENT)
    tasks.note_progress(task, progress)
    tasks.note_progress(task, make_run(reply=None, kind=Trigger.MONITOR_EVENT))
    assert task.progress == [{"runId": "run_9", "text": "42%", "at": LATER}]
    assert task.interim is None and task.result is None


# ---------------------------------------------------------------------------- complete


@pytest.mark.parametrize(
    ("run_status", "task_status"),
    [
        (RunStatus.COMPLETED, TaskStatus.COMPLETED),
        (RunStatus.FAILED, TaskStatus.FAILED),
        (RunStatus.INTERRUPTED, TaskStatus.INTERRUPTED),
        (RunStatus.CANCELLED, TaskStatus.CANCELLED),
    ],
)
@pytest.mark.parametrize("opened", OPEN)
@pytest.mark.parametrize("reply", ["FINAL", None, ""])
def test_complete_takes_status_and_text_from_the_answer_run(
    run_status: RunStatus, task_status: TaskStatus, opened: TaskStatus, reply: str | None
) -> None:
    task = make_task(opened, interim="WAITING")
    answer = make_run(run_status, reply)
    tasks.complete(task, answer, LATER)
    assert task.status == task_status
    assert task.result == {"text": reply, "runId": "run_9", "status": str(task_status)}
    assert type(task.result["status"]) is str
    assert task.work_state == WorkState.RESULT_AVAILABLE
    assert task.completed_at == LATER
    assert task.interim == "WAITING", "complete() does not rewrite the interim"
    assert not task.is_open


def test_complete_without_an_answer_run_is_completed_with_no_reply() -> None:
    task = make_task()
    tasks.complete(task, None, LATER)
    assert task.status == TaskStatus.COMPLETED
    assert task.result == {"text": None, "runId": None, "status": "completed"}


def test_a_progress_run_is_never_a_result() -> None:
    task = make_task()
    with pytest.raises(DomainError):
        tasks.complete(task, make_run(reply="50%", kind=Trigger.MONITOR_EVENT), LATER)
    assert task.is_open and task.result is None and task.completed_at is None


@pytest.mark.parametrize("kind", [k for k in Trigger if k != Trigger.MONITOR_EVENT])
def test_every_non_progress_trigger_can_answer(kind: Trigger) -> None:
    task = make_task()
    tasks.complete(task, make_run(reply="ok", kind=kind), LATER)
    assert task.result is not None and task.result["text"] == "ok"


@pytest.mark.parametrize("status", TERMINAL)
def test_a_terminal_task_never_completes_again(status: TaskStatus) -> None:
    task = make_task(status, result={"text": "first", "runId": "run_1", "status": str(status)})
    before = task.to_dict()
    with pytest.raises(DomainError):
        tasks.complete(task, make_run(reply="second"), LATER)
    assert task.to_dict() == before


# ---------------------------------------------------------------------------- cancel


@pytest.mark.parametrize("opened", OPEN)
def test_cancel_result_shape(opened: TaskStatus) -> None:
    task = make_task(opened, interim="WAITING")
    tasks.cancel(task, LATER)
    assert task.status == TaskStatus.CANCELLED
    assert task.result == {"text": None, "runId": None, "status": "cancelled"}
    assert task.work_state == WorkState.RESULT_AVAILABLE
    assert task.completed_at == LATER


@pytest.mark.parametrize("status", TERMINAL)
def test_a_terminal_task_cannot_be_cancelled(status: TaskStatus) -> None:
    task = make_task(status)
    with pytest.raises(DomainError):
        tasks.cancel(task, LATER)
    assert task.status == status and task.result is None


# ---------------------------------------------------------------------------- follow-ups


@pytest.mark.parametrize("hold", [True, False])
def test_follow_up_is_a_fresh_task_for_the_same_threads(hold: bool) -> None:
    original = make_task(
        TaskStatus.COMPLETED, title="build", mode="wait", hold=hold, interim="x",
        result={"text": "r", "runId": "run_1", "status": "completed"}, delivery_state=Delivery.ACKNOWLEDGED,
        progress=[{"runId": "r", "text": "p", "at": AT}], waiting_call=True,
    )
    follow = tasks.follow_up(original, "tsk_2", LATER)
    assert follow.id == "tsk_2"
    assert follow.follow_up_of == original.id
    copied = ("parent_environment_id", "parent_thread_id", "child_environment_id", "child_thread_id", "title")
    for name in copied:
        assert getattr(follow, name) == getattr(original, name)
    assert follow.hold is hold
    assert follow.mode == "async"
    assert follow.status == TaskStatus.QUEUED
    assert follow.work_state == WorkState.WORKING
    assert follow.delivery_state == Delivery.PENDING
    assert (follow.result, follow.interim, follow.progress, follow.follow_ups) == (None, None, [], [])
    assert follow.waiting_call is False and follow.created_at == LATER
    assert follow.wake_message_id is None and follow.delivered_as is None
    assert original.follow_ups == [], "follow_up() does not touch the original"


# ---------------------------------------------------------------------------- delivery

D = Delivery
LEGAL = {
    (D.PENDING, D.CLAIMED), (D.PENDING, D.DELIVERED), (D.CLAIMED, D.DELIVERED),
    (D.DELIVERED, D.ACKNOWLEDGED), (D.PENDING, D.DISPOSED), (D.CLAIMED, D.DISPOSED),
}
TARGETS = [D.CLAIMED, D.DELIVERED, D.ACKNOWLEDGED, D.DISPOSED]


@pytest.mark.parametrize(("start", "to"), list(itertools.product(list(Delivery), TARGETS)))
def test_advance_delivery_matrix(start: Delivery, to: Delivery) -> None:
    task = make_task(delivery_state=start)
    moved = tasks.advance_delivery(task, to)
    assert moved is ((start, to) in LEGAL)
    assert task.delivery_state == (to if moved else start)


def test_the_happy_path_pending_claimed_delivered_acknowledged() -> None:
    task = make_task()
    assert task.delivery_state == D.PENDING
    for step in (D.CLAIMED, D.DELIVERED, D.ACKNOWLEDGED):
        assert tasks.advance_delivery(task, step) is True
        assert task.delivery_state == step


@pytest.mark.parametrize("to", TARGETS)
def test_a_duplicate_step_returns_false_and_changes_nothing(to: Delivery) -> None:
    task = make_task()
    if to == D.ACKNOWLEDGED:
        tasks.advance_delivery(task, D.DELIVERED)
    assert tasks.advance_delivery(task, to) is True
    before = task.to_dict()
    assert tasks.advance_delivery(task, to) is False
    assert task.to_dict() == before


@pytest.mark.parametrize("start", list(Delivery))
def test_disposed_and_acknowledged_are_final(start: Delivery) -> None:
    for final in (D.DISPOSED, D.ACKNOWLEDGED):
        task = make_task(delivery_state=final)
        for to in TARGETS:
            assert tasks.advance_delivery(task, to) is False
            assert task.delivery_state == final


def test_advancing_to_pending_is_a_harmless_no_op() -> None:
    for start in Delivery:
        task = make_task(delivery_state=start)
        assert tasks.advance_delivery(task, D.PENDING) is False
        assert task.delivery_state == start


RANK = {D.PENDING: 0, D.CLAIMED: 1, D.DELIVERED: 2, D.ACKNOWLEDGED: 3}


@given(st.lists(st.sampled_from(TARGETS), max_size=30))
def test_random_delivery_sequences_never_go_backwards(steps: list[Delivery]) -> None:
    task = make_task()
    seen = [task.delivery_state]
    for to in steps:
        before = task.delivery_state
        moved = tasks.advance_delivery(task, to)
        after = task.delivery_state
        if not moved:
            assert after == before
            continue
        assert after == to
        assert before not in (D.DISPOSED, D.ACKNOWLEDGED)
        if after == D.DISPOSED:
            assert before in (D.PENDING, D.CLAIMED), "only an undelivered result can be disposed"
        else:
            assert RANK[after] > RANK[before]
        seen.append(after)
    # a delivery never revisits a state
    assert len(seen) == len(set(seen))
    if D.DISPOSED in seen:
        assert seen[-1] == D.DISPOSED and D.DELIVERED not in seen


# ---------------------------------------------------------------------------- wake text


def done(task_id: str, text: str | None, status: str = TaskStatus.COMPLETED, **fields: object) -> Task:
    return make_task(status, task_id, result={"text": text, "runId": "run_x", "status": status}, **fields)


def test_wake_text_of_one_task() -> None:
    assert tasks.wake_text([done("tsk_a", "FINAL")]) == "[task tsk_a: completed]\nFINAL"


def test_wake_text_names_the_title_and_follow_ups() -> None:
    text = tasks.wake_text([done("tsk_b", "again", title="build", follow_up_of="tsk_a")])
    assert text == '[follow-up of tsk_a tsk_b "build": completed]\nagain'


def test_wake_text_says_no_reply_for_a_null_result_and_shows_the_status() -> None:
    assert tasks.wake_text([done("tsk_a", None, TaskStatus.FAILED)]) == "[task tsk_a: failed]\n(no reply)"
    cancelled = make_task(TaskStatus.RUNNING, "tsk_c")
    tasks.cancel(cancelled, LATER)
    assert tasks.wake_text([cancelled]) == "[task tsk_c: cancelled]\n(no reply)"


def test_an_empty_reply_is_verbatim_not_no_reply() -> None:
    assert tasks.wake_text([done("tsk_a", "")]) == "[task tsk_a: completed]\n"


def test_wake_text_carries_nothing_else_from_the_child() -> None:
    task = done(
        "tsk_a", "THE RESULT", interim="SECRET-INTERIM",
        progress=[{"runId": "r", "text": "SECRET-PROGRESS", "at": AT}],
    )
    text = tasks.wake_text([task])
    assert "SECRET" not in text and "THE RESULT" in text


def test_wake_text_of_nothing_is_empty() -> None:
    assert tasks.wake_text([]) == ""


texts = st.one_of(st.none(), st.text(max_size=40))


@given(st.lists(texts, min_size=1, max_size=6))
def test_wake_text_lists_each_task_once_with_its_result_verbatim(results: list[str | None]) -> None:
    batch = [done(f"tsk_{i:03d}", text) for i, text in enumerate(results)]
    text = tasks.wake_text(batch)
    cursor = 0
    for task, result in zip(batch, results, strict=True):
        header = f"[task {task.id}: completed]\n"
        assert text.count(header) == 1
        body = result if result is not None else "(no reply)"
        block = header + body
        at = text.find(block, cursor)
        assert at >= cursor, "tasks appear in order, each with its verbatim result"
        cursor = at + len(block)
    assert cursor == len(text)
    blocks = sum(len(f"[task {t.id}: completed]\n" + (r if r is not None else "(no reply)"))
                 for t, r in zip(batch, results, strict=True))
    assert len(text) == blocks + 2 * (len(batch) - 1), "nothing but the blocks and blank-line separators"


def test_wake_text_accepts_a_generator() -> None:
    assert tasks.wake_text(t for t in [done("tsk_a", "x")]) == "[task tsk_a: completed]\nx"


@pytest.mark.parametrize(
    ("start", "delivered_as"), list(itertools.product(list(Delivery), ["call", "result", None]))
)
def test_only_a_calls_claim_is_released_back_to_pending(start: Delivery, delivered_as: str | None) -> None:
    task = make_task(delivery_state=start, delivered_as=delivered_as)
    released = tasks.release_claim(task)
    assert released is (start == D.CLAIMED and delivered_as == "call")
    expected = (D.PENDING, None) if released else (start, delivered_as)
    assert (task.delivery_state, task.delivered_as) == expected


@pytest.mark.parametrize(
    ("status", "item"),
    [
        (TaskStatus.COMPLETED, ItemStatus.ENDED),
        (TaskStatus.FAILED, ItemStatus.FAILED),
        (TaskStatus.INTERRUPTED, ItemStatus.FAILED),
        (TaskStatus.CANCELLED, ItemStatus.CANCELLED),
    ],
)
def test_a_terminal_tasks_item_in_its_parent_ends_by_the_tasks_status(status: str, item: str) -> None:
    assert tasks.item_end(make_task(status)) == item


@pytest.mark.parametrize(
    ("text", "provider"),
    [
        ('{"tether_script": {"rules": []}}', "script"),
        ('{"other": 1}', "claude"),
        ("[1, 2]", "claude"),
        ("write the tests", "claude"),
    ],
)
def test_only_a_script_object_picks_the_script_provider(text: str, provider: str) -> None:
    assert tasks.default_provider(text, "claude") == provider
