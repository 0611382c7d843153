"""A state machine over a real Commands on a temp SQLite file.

Hypothesis interleaves a parent delegating tasks with everything a child and the
world can do (runs ending with replies or failures, background commands, monitors,
schedules, sends from the parent, cancels, deadlines passing, the parent's wake runs
ending) and checks G1-G4 and the deadline rules of SPEC §11 after every step, plus a
drain at the end: once every run and every item has ended, every task is terminal and
every result that was not disposed is delivered.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tether_world import World, commit_violations

from tether.domain import tasks as task_rules
from tether.domain.records import Item, Message, Run, Task, Thread
from tether.domain.types import (
    ACTIVE_RUN,
    Delivery,
    ItemKind,
    ItemStatus,
    RunStatus,
    TaskStatus,
    Trigger,
)
from tether.types import ADMIN, Caller

_RESULT_STATUS = {
    RunStatus.COMPLETED: TaskStatus.COMPLETED,
    RunStatus.FAILED: TaskStatus.FAILED,
    RunStatus.INTERRUPTED: TaskStatus.INTERRUPTED,
}
MAX_CHILDREN = 4

pick = st.integers(min_value=0, max_value=10_000)
deadline_modes = st.sampled_from([None, None, "wake", "cancel"])


class Snapshot:
    """Everything in the store, read in one transaction."""

    def __init__(self, world: World) -> None:
        with world.store.transaction() as tx:
            self.threads = {t.id: t for t in tx.find(Thread)}
            self.runs = {r.id: r for r in tx.find(Run)}
            self.messages = {m.id: m for m in tx.find(Message)}
            self.items = {i.id: i for i in tx.find(Item)}
            self.tasks = {t.id: t for t in tx.find(Task)}
            self.violations = commit_violations(tx)

    def runs_of(self, thread_id: str) -> list[Run]:
        return sorted((r for r in self.runs.values() if r.thread_id == thread_id), key=lambda r: r.seq)

    def tasks_of(self, child_id: str) -> list[Task]:
        return [t for t in self.tasks.values() if t.child_thread_id == child_id]


class Delegation(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="tether-sm-"))
        self.world = World(self.dir / "t.db")
        self.parent_id, _ = self.world.parent("parent")
        self.children: list[str] = []
        self.replies = 0
        #: follow-ups opened at once by a parent thread_send
        self.sent_follow_ups: set[str] = set()
        #: tasks the parent thread itself cancelled while open (their delivery is disposed)
        self.parent_cancelled: set[str] = set()

    # ------------------------------------------------------------------ helpers

    def reply(self) -> str:
        self.replies += 1
        return f"<R{self.replies}>"

    def snap(self) -> Snapshot:
        return Snapshot(self.world)

    def caller(self, thread_id: str) -> Caller:
        return self.world.as_thread(thread_id, during_run=True)

    def live_children(self) -> list[str]:
        return [c for c in self.children if not self.world.thread(c).cancelled]

    def running_items(self, kind: str, **flags: Any) -> list[Item]:
        found = []
        for child in self.children:
            for item in self.world.items(child, status=ItemStatus.RUNNING, kind=kind):
                if all(getattr(item, k) == v for k, v in flags.items()):
                    found.append(item)
        return found

    @staticmethod
    def choose(options: list[Any], n: int) -> Any:
        return options[n % len(options)] if options else None

    # ------------------------------------------------------------------ rules

    @initialize(hold=st.booleans(), deadline=deadline_modes)
    def first_delegation(self, hold: bool, deadline: str | None) -> None:
        self.delegate(hold=hold, during_run=True, deadline=deadline)

    @rule(hold=st.booleans(), during_run=st.booleans(), deadline=deadline_modes)
    def delegate(self, hold: bool, during_run: bool, deadline: str | None) -> None:
        if len(self.children) >= MAX_CHILDREN:
            return
        caller = self.world.as_thread(self.parent_id, during_run=during_run)
        view = self.world.commands.delegate(
            caller,
            "do the job",
            provider="script",
            hold=hold,
            deadline_ms=60_000 if deadline else None,
            on_deadline=deadline,
        )
        self.children.append(view["childThreadId"])

    def armed(self, s: Snapshot) -> list[Task]:
        """Open tasks whose deadline has not fired yet."""
        return [t for t in s.tasks.values() if t.deadline_at is not None and t.is_open and not t.overdue]

    @precondition(lambda self: bool(self.armed(self.snap())))
    @rule(n=pick)
    def deadline_passes(self, n: int) -> None:
        """The timer fires an armed deadline."""
        self.fire_deadline(self.choose(self.armed(self.snap()), n))

    @rule(n=pick)
    def deadline_fires_again(self, n: int) -> None:
        """The timer fires any deadline — again (a restart, a duplicate), or after the end."""
        self.fire_deadline(self.choose([t for t in self.snap().tasks.values() if t.deadline_at], n))

    def fire_deadline(self, task: Task | None) -> None:
        if task is None:
            return
        [item] = [i for i in self.snap().items.values() if i.task_id == task.id]
        fires = task.is_open and not task.overdue
        dumped = self.world.dump()
        self.world.commands.deadline_due(item.id)
        if not fires:
            assert self.world.dump() == dumped, "a deadline fires once, and only while its task is open"
            return
        after = self.world.task(task.id)
        assert after.overdue
        if task.on_deadline == "cancel":
            assert after.status == TaskStatus.CANCELLED and after.cancel_reason == "deadline"
        else:
            assert after.is_open, "a wake deadline leaves the task open"

    @rule(n=pick, how=st.sampled_from(["reply", "reply", "none", "fail", "fail"]))
    def child_run_ends(self, n: int, how: str) -> None:
        busy = [c for c in self.children if self.world.running(c) is not None]
        child = self.choose(busy, n)
        if child is None:
            return
        if how == "fail":
            self.world.end(child, None, RunStatus.FAILED)
        else:
            self.world.end(child, self.reply() if how == "reply" else None)

    @rule(n=pick, awaited=st.booleans())
    def start_command(self, n: int, awaited: bool) -> None:
        child = self.choose(self.live_children(), n)
        if child is not None:
            self.world.commands.start_process(self.caller(child), "command", "make test", awaited=awaited)

    @rule(n=pick)
    def await_command(self, n: int) -> None:
        item = self.choose(self.running_items(ItemKind.COMMAND, awaited=False), n)
        if item is not None and not self.world.thread(item.thread_id).cancelled:
            self.world.commands.background_wait(self.caller(item.thread_id), item.id)

    @rule(n=pick, code=st.sampled_from([0, 1, None]))
    def command_ends(self, n: int, code: int | None) -> None:
        item = self.choose(self.running_items(ItemKind.COMMAND), n)
        if item is not None:
            self.world.commands.process_ended(item.id, code, reason=None if code is not None else "killed")

    @rule(n=pick, persistent=st.booleans())
    def start_monitor(self, n: int, persistent: bool) -> None:
        child = self.choose(self.live_children(), n)
        if child is not None:
            self.world.commands.start_process(
                self.caller(child), "monitor", "tail -f log", persistent=persistent
            )

    @rule(n=pick, count=st.integers(1, 3), persistent=st.booleans())
    def monitor_prints(self, n: int, count: int, persistent: bool) -> None:
        item = self.choose(self.running_items(ItemKind.MONITOR), n)
        if item is None:  # no monitor yet: start one, so output happens often enough
            self.start_monitor(n, persistent)
            item = self.choose(self.running_items(ItemKind.MONITOR), n)
        if item is None:
            return
        before = set(self.snap().tasks)
        lines = [f"line {item.offset + i}" for i in range(count)]
        self.world.commands.monitor_output(item.id, lines, item.offset + count)
        assert set(self.snap().tasks) == before, "monitor output (a progress run) opened a task (G4)"

    @rule(n=pick, with_lines=st.booleans())
    def monitor_ends(self, n: int, with_lines: bool) -> None:
        item = self.choose(self.running_items(ItemKind.MONITOR), n)
        if item is not None:
            lines = ["last line"] if with_lines else None
            self.world.commands.process_ended(item.id, 0, lines=lines, offset=item.offset + 1)

    @rule(n=pick, hold=st.booleans())
    def schedule(self, n: int, hold: bool) -> None:
        child = self.choose(self.live_children(), n)
        if child is not None:
            self.world.commands.schedule(self.caller(child), 1000, "look again", hold)

    @rule(n=pick)
    def schedule_falls_due(self, n: int) -> None:
        item = self.choose(self.running_items(ItemKind.SCHEDULE), n)
        if item is not None:
            self.world.commands.schedule_due(item.id)

    @rule(n=pick)
    def parent_sends(self, n: int) -> None:
        child = self.choose(self.children, n)
        if child is None:
            return
        before = self.snap()
        self.world.commands.post_message(self.caller(self.parent_id), child, "one more thing")
        after = self.snap()
        new = [t for t in after.tasks.values() if t.id not in before.tasks]
        thread = before.threads[child]
        if thread.cancelled or thread.open_task_id is not None:
            assert new == [], "a send to a cancelled child or while its task is open opens no follow-up"
        else:
            assert len(new) == 1 and new[0].child_thread_id == child
            self.sent_follow_ups.add(new[0].id)

    @rule(n=pick, by_parent=st.booleans())
    def cancel(self, n: int, by_parent: bool) -> None:
        snap = self.snap()
        task = self.choose(list(snap.tasks.values()), n)  # store order: ids are random, never sort on them
        if task is None:
            return
        caller = self.caller(self.parent_id) if by_parent else ADMIN
        answer = self.world.commands.cancel_task(caller, task.id)
        if task.is_open:
            assert answer["status"] == TaskStatus.CANCELLED
            if by_parent:
                self.parent_cancelled.add(task.id)
        else:
            assert answer["status"] == task.status
            assert self.world.task(task.id).to_dict() == task.to_dict()

    @rule(status=st.sampled_from([RunStatus.COMPLETED, RunStatus.COMPLETED, RunStatus.FAILED]))
    def parent_run_ends(self, status: str) -> None:
        if self.world.running(self.parent_id) is not None:
            self.world.end(self.parent_id, self.reply() if status == RunStatus.COMPLETED else None, status)

    @rule(n=pick)
    def duplicate_end_changes_nothing(self, n: int) -> None:
        ended = [i for c in self.children for i in self.world.items(c)
                 if not i.is_running and i.kind != ItemKind.TASK]
        item = self.choose(ended, n)
        if item is None:
            return
        before = self.world.dump()
        if item.kind == ItemKind.SCHEDULE:
            self.world.commands.schedule_due(item.id)
        else:
            self.world.commands.process_ended(item.id, 0, lines=["again"])
        assert self.world.dump() == before

    @rule()
    def drain(self) -> None:
        self.drain_and_check()

    # ------------------------------------------------------------------ the end

    def drain_and_check(self) -> None:
        for _ in range(500):
            moved = False
            for child in self.children:
                for item in self.world.items(child, status=ItemStatus.RUNNING):
                    if item.kind == ItemKind.SCHEDULE:
                        self.world.commands.schedule_due(item.id)
                    elif item.kind in (ItemKind.COMMAND, ItemKind.MONITOR):
                        self.world.commands.process_ended(item.id, 0)
                    moved = True
            for thread_id in [*self.children, self.parent_id]:
                if self.world.running(thread_id) is not None:
                    self.world.end(thread_id, self.reply())
                    moved = True
            if not moved:
                break
            self.check(self.snap())
        else:
            raise AssertionError("the drain did not come to rest")
        snap = self.snap()
        assert not [r for r in snap.runs.values() if r.status in ACTIVE_RUN], "a run is still queued"
        assert not [i for i in snap.items.values() if i.is_running], "an item is still running"
        for thread in snap.threads.values():
            assert thread.settled and thread.status == "idle"
        for task in snap.tasks.values():
            assert not task.is_open, f"{task.id} is still {task.status} after everything ended"
            if task.id in self.parent_cancelled:
                assert task.delivery_state == Delivery.DISPOSED
            else:
                assert task.delivery_state == Delivery.ACKNOWLEDGED, (task.id, task.delivery_state)
        self.check(snap)

    def teardown(self) -> None:
        try:
            if not self.world.violations:
                self.drain_and_check()
        finally:
            self.world.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def guarantees_hold(self) -> None:
        self.check(self.snap())

    def check(self, s: Snapshot) -> None:
        assert self.world.violations == [], self.world.violations
        assert s.violations == []
        self.check_children(s)
        self.check_results(s)
        self.check_wakes(s)
        self.check_progress(s)
        self.check_deadlines(s)

    def check_children(self, s: Snapshot) -> None:
        for child_id in self.children:
            child = s.threads[child_id]
            open_tasks = [t for t in s.tasks_of(child_id) if t.is_open]
            assert len(open_tasks) <= 1, "at most one open task per child"
            assert [t.id for t in open_tasks] == ([child.open_task_id] if child.open_task_id else [])
            runs = s.runs_of(child_id)
            active = [r for r in runs if r.status in ACTIVE_RUN]
            held = [i for i in s.items.values() if i.thread_id == child_id and i.held]
            if child.settled:  # G2
                assert not held and all(r.is_progress for r in active)
            if child.settled and not child.cancelled:  # G1: a settled child has answered
                assert child.open_task_id is None
                answers = [r for r in runs
                           if not r.is_progress and r.started_at and r.status not in ACTIVE_RUN]
                latest = s.tasks[child.latest_task_id]
                assert latest.result is not None
                assert latest.result["runId"] == answers[-1].id, "the last answer is the latest result"
            for task in s.tasks_of(child_id):
                [item] = [i for i in s.items.values() if i.task_id == task.id]
                assert item.thread_id == self.parent_id
                assert item.is_running == task.is_open
                if task.follow_up_of is not None:
                    assert task.follow_up_of == child.root_task_id
                    opened_by_run = any(
                        r.started_at == task.created_at and not r.is_progress for r in runs
                    )
                    assert task.id in self.sent_follow_ups or opened_by_run, (
                        f"follow-up {task.id} opened by neither a send nor a non-progress run (G4)")

    def check_results(self, s: Snapshot) -> None:
        for task in s.tasks.values():
            if task.is_open:
                assert task.result is None
                assert task.delivery_state == Delivery.PENDING
                continue
            if task.status == TaskStatus.CANCELLED:
                assert task.result == {"text": None, "runId": None, "status": "cancelled"}
            else:
                answer = s.runs[task.result["runId"]]
                assert answer.thread_id == task.child_thread_id
                assert not answer.is_progress, "a progress run is never a result (G4)"
                assert answer.started_at is not None and answer.status not in ACTIVE_RUN
                assert task.result["text"] == answer.reply
                assert task.status == _RESULT_STATUS[RunStatus(answer.status)] == task.result["status"]
            if task.id in self.parent_cancelled:
                assert task.delivery_state == Delivery.DISPOSED and task.wake_message_id is None
            else:
                assert task.delivery_state != Delivery.PENDING, f"terminal {task.id} was never delivered"
                assert task.delivery_state != Delivery.DISPOSED

    def check_wakes(self, s: Snapshot) -> None:
        queued_wakes = [r for r in s.runs_of(self.parent_id)
                        if r.kind == Trigger.DELEGATED_TASK and r.status == RunStatus.QUEUED]
        assert len(queued_wakes) <= 1, "results completing while a wake is queued fold into it (G3)"
        listed: dict[str, str] = {}
        for message in s.messages.values():
            source = message.source or {}
            if source.get("kind") != Trigger.DELEGATED_TASK:
                continue
            assert message.thread_id == self.parent_id
            task_ids = source["taskIds"]
            assert task_ids and len(task_ids) == len(set(task_ids))
            for task_id in task_ids:
                assert task_id not in listed, f"{task_id} is in two wake messages (G3)"
                listed[task_id] = message.id
            owners = [r for r in s.runs.values() if message.id in r.trigger.get("messageIds", [])]
            assert len(owners) == 1, "each wake message belongs to exactly one run"
            [run] = owners
            assert run.kind == Trigger.DELEGATED_TASK and run.id == message.run_id
            assert run.trigger["taskIds"] == task_ids
            assert message.text == task_rules.wake_text(s.tasks[t] for t in task_ids)
            for task_id in task_ids:
                task = s.tasks[task_id]
                assert (task.wake_message_id, task.wake_run_id) == (message.id, run.id)
                if run.started_at is not None:
                    assert task.completed_at <= run.started_at, "a result folded into a started wake"
                expected = {
                    RunStatus.QUEUED: Delivery.CLAIMED,
                    RunStatus.RUNNING: Delivery.DELIVERED,
                }.get(RunStatus(run.status), Delivery.ACKNOWLEDGED if run.started_at else Delivery.CLAIMED)
                assert task.delivery_state == expected
        for task in s.tasks.values():
            if task.delivery_state in (Delivery.CLAIMED, Delivery.DELIVERED, Delivery.ACKNOWLEDGED):
                assert listed.get(task.id) == task.wake_message_id is not None
                text = s.messages[task.wake_message_id].text
                body = task.result["text"] if task.result["text"] is not None else "(no reply)"
                assert f"{task.id}: {task.status}]\n{body}" in text
                assert task.delivered_as == ("follow-up" if task.follow_up_of else "result")
            else:
                assert task.id not in listed

    def check_deadlines(self, s: Snapshot) -> None:
        """SPEC §11: one ``task_deadline`` notice and run per wake-mode task whose deadline
        passed while it was open, none otherwise; a cancel-mode one is cancelled instead."""
        notices: dict[str, list[Message]] = {}
        for message in s.messages.values():
            if (message.source or {}).get("kind") == Trigger.TASK_DEADLINE:
                assert message.thread_id == self.parent_id
                notices.setdefault(message.source["taskId"], []).append(message)
                [run] = [r for r in s.runs.values() if message.id in r.trigger.get("messageIds", [])]
                assert run.kind == Trigger.TASK_DEADLINE and run.trigger["taskId"] == message.source["taskId"]
        for task in s.tasks.values():
            found = notices.get(task.id, [])
            assert task.overdue or not found
            if task.overdue:
                assert task.deadline_at is not None
                if task.on_deadline == "wake":
                    assert len(found) == 1, f"{task.id}: {len(found)} deadline notices"
                else:
                    assert not found and task.status == TaskStatus.CANCELLED
                    assert task.cancel_reason == "deadline"
            [item] = [i for i in s.items.values() if i.task_id == task.id]
            if item.is_running and item.due_at is not None:  # armed: it has not fired yet
                assert not task.overdue and item.due_at == task.deadline_at

    def check_progress(self, s: Snapshot) -> None:
        progress_replies = {r.reply for r in s.runs.values() if r.is_progress and r.reply is not None}
        results = {t.result["text"] for t in s.tasks.values() if t.result}
        interims = {t.interim for t in s.tasks.values()}
        assert not progress_replies & results, "a progress reply became a result (G4)"
        assert not progress_replies & interims, "a progress reply became an interim (G4)"
        for message in s.messages.values():
            if (message.source or {}).get("kind") == Trigger.DELEGATED_TASK:
                assert not any(p in message.text for p in progress_replies)
        for task in s.tasks.values():
            for entry in task.progress:
                assert s.runs[entry["runId"]].is_progress
        for item in s.items.values():
            if item.kind != ItemKind.MONITOR or item.is_running:
                continue
            mine = [r for r in s.runs_of(item.thread_id) if r.trigger.get("key") == item.id]
            finished = [r for r in mine if r.kind == Trigger.MONITOR_FINISHED]
            expected = 0 if item.status == ItemStatus.CANCELLED else 1
            assert len(finished) == expected, "one end run per monitor"
            assert not [r for r in mine if r.is_progress and r.status == RunStatus.QUEUED], (
                "a monitor's unhandled lines fold into its monitor_finished run")


Delegation.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestDelegation = Delegation.TestCase
