"""The store contract: every backend must pass :class:`StoreContract` (see ``tether.store.base``).

A backend binds it with a subclass in a ``test_<backend>.py`` module that says how to open a
store at a location (``make_store``); the same location opened again must be the same store,
and two stores opened at one location behave like two processes sharing it. Nothing here
knows a backend's dialect: backend details are tested in the backend's own module.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tether.codec import loads
from tether.domain.records import Item, Link, Message, Record, Run, Send, Task, Thread, Token
from tether.domain.types import Delivery, ItemKind, RunStatus, TaskStatus
from tether.store.base import TABLES, ForeignThread, Store

AT = "2026-01-01T00:00:00.000Z"


def thread(tid: str, token_id: str | None = None, **fields: Any) -> Thread:
    return Thread(id=tid, provider="script", created_at=AT, token_id=token_id, **fields)


def run(rid: str, thread_id: str, seq: int, status: str = RunStatus.QUEUED) -> Run:
    return Run(rid, thread_id, seq, {"kind": "user", "key": None, "messageIds": []}, AT, status=status)


def item(iid: str, thread_id: str, kind: str = ItemKind.COMMAND, **fields: Any) -> Item:
    return Item(id=iid, thread_id=thread_id, kind=kind, started_at=AT, **fields)


def task(tid: str, parent: str = "thr_p", child: str = "thr_c", **fields: Any) -> Task:
    return Task(
        id=tid, parent_environment_id="env_a", parent_thread_id=parent,
        child_environment_id="env_a", child_thread_id=child, created_at=AT, **fields,
    )


def samples() -> list[Record]:
    """One of each record kind, with nested values, None and booleans set."""
    return [
        thread("thr_1", "tok_1", title="t",
               parent={"environmentId": "env_a", "threadId": "thr_0", "taskId": "tsk_0"},
               state={"fired": [0, 2], "ids": {"b1": "bg_1"}, "nested": {"deep": [None, True, 1.5]}},
               cancelled=True, settled=False, run_count=3),
        Run("run_1", "thr_1", 1,
            {"kind": "delegated_task", "key": None, "messageIds": ["m1"], "taskIds": ["t"]}, AT,
            status=RunStatus.COMPLETED, reply="ünïcode ✓\nline 2", error=None, started_at=AT, ended_at=AT),
        Message("msg_1", "thr_1", 1, "notification", "text", AT, source={"kind": "scheduled", "x": None},
                run_id="run_1"),
        item("bg_1", "thr_1", ItemKind.MONITOR, persistent=True, label="m", command="tail", exit_code=0,
             pid=123, offset=77, last_line="last"),
        task("tsk_1", "thr_1", "thr_2", status=TaskStatus.COMPLETED,
             result={"text": None, "runId": None, "status": "cancelled"},
             progress=[{"runId": "r", "text": "p", "at": AT}], follow_ups=["tsk_2"],
             delivery_state=Delivery.ACKNOWLEDGED, hold=False),
        Token(id="tok_1", label="peer", hash="h" * 64, created_at=AT, thread_id="thr_1", revoked=True),
        Link(environment_id="env_b", name="b", url="http://b", token="secret", created_at=AT, cursor="17"),
        Send(id="snd_1", environment_id="env_b", thread_id="thr_9", text="go on", created_at=AT,
             origin={"environmentId": "env_a", "threadId": "thr_1"}, status="sent",
             result={"messageId": "msg_9", "runId": None, "delivery": "queued"}),
    ]


class StoreContract:
    """Behaviour every :class:`~tether.store.base.Store` backend must show."""

    def make_store(self, location: Path) -> Store:
        raise NotImplementedError

    @pytest.fixture
    def location(self, tmp_path: Path) -> Path:
        return tmp_path

    @pytest.fixture
    def store(self, location: Path) -> Iterator[Store]:
        store = self.make_store(location)
        yield store
        store.close()

    # ------------------------------------------------------------------ records

    @pytest.mark.parametrize("index", range(len(samples())))
    def test_put_then_get_round_trips_every_record_kind(self, store: Store, index: int) -> None:
        record = samples()[index]
        key = getattr(record, TABLES[type(record)].key)
        with store.transaction() as tx:
            assert tx.get(type(record), key) is None
            tx.put(record)
            assert tx.get(type(record), key) == record, "a transaction reads its own writes"
        with store.transaction() as tx:
            got = tx.get(type(record), key)
        assert got == record
        assert got is not record

    def test_put_replaces_a_record_with_the_same_key(self, store: Store) -> None:
        with store.transaction() as tx:
            tx.put(run("run_1", "thr_1", 1))
        with store.transaction() as tx:
            tx.put(run("run_1", "thr_1", 1, RunStatus.RUNNING))
        with store.transaction() as tx:
            assert tx.count(Run) == 1
            assert tx.get(Run, "run_1").status == RunStatus.RUNNING
            assert [r.id for r in tx.find(Run, status=RunStatus.QUEUED)] == []
            assert [r.id for r in tx.find(Run, status=RunStatus.RUNNING)] == ["run_1"]

    def test_get_of_an_unknown_key_is_none(self, store: Store) -> None:
        with store.transaction() as tx:
            for cls in TABLES:
                assert tx.get(cls, "nope") is None

    def test_find_filters_on_indexed_fields(self, store: Store) -> None:
        with store.transaction() as tx:
            tx.put(run("run_a1", "thr_a", 1, RunStatus.COMPLETED))
            tx.put(run("run_a2", "thr_a", 2, RunStatus.RUNNING))
            tx.put(run("run_a3", "thr_a", 3))
            tx.put(run("run_b1", "thr_b", 1, RunStatus.RUNNING))
        with store.transaction() as tx:
            assert [r.id for r in tx.find(Run, thread_id="thr_a")] == ["run_a1", "run_a2", "run_a3"]
            assert [r.id for r in tx.find(Run, thread_id="thr_a", status=RunStatus.RUNNING)] == ["run_a2"]
            assert {r.id for r in tx.find(Run, status=RunStatus.RUNNING)} == {"run_a2", "run_b1"}
            assert [r.id for r in tx.find(Run, id="run_b1")] == ["run_b1"]
            assert tx.find(Run, thread_id="thr_none") == []
            assert len(tx.find(Run)) == 4

    @pytest.mark.parametrize("container", [list, tuple, set, frozenset])
    def test_find_with_a_collection_means_in(self, store: Store, container: type) -> None:
        with store.transaction() as tx:
            tx.put(run("run_1", "thr_a", 1, RunStatus.QUEUED))
            tx.put(run("run_2", "thr_a", 2, RunStatus.RUNNING))
            tx.put(run("run_3", "thr_a", 3, RunStatus.COMPLETED))
        with store.transaction() as tx:
            active = container([RunStatus.QUEUED, RunStatus.RUNNING])
            assert [r.id for r in tx.find(Run, thread_id="thr_a", status=active)] == ["run_1", "run_2"]
            assert tx.count(Run, status=active) == 2
            assert [r.id for r in tx.find(Run, status=container([RunStatus.COMPLETED]))] == ["run_3"]

    def test_find_with_an_empty_collection_finds_nothing(self, store: Store) -> None:
        with store.transaction() as tx:
            tx.put(run("run_1", "thr_a", 1))
            assert tx.find(Run, status=[]) == []
            assert tx.count(Run, status=[]) == 0
            assert tx.find(Run, thread_id="thr_a", status=set()) == []

    def test_find_with_none_means_null(self, store: Store) -> None:
        with store.transaction() as tx:
            tx.put(task("tsk_root"))
            tx.put(task("tsk_f1", follow_up_of="tsk_root"))
            tx.put(task("tsk_f2", follow_up_of="tsk_root"))
            tx.put(thread("thr_1"))
            tx.put(thread("thr_2", "tok_x"))
        with store.transaction() as tx:
            assert [t.id for t in tx.find(Task, follow_up_of=None)] == ["tsk_root"]
            assert [t.id for t in tx.find(Task, follow_up_of="tsk_root")] == ["tsk_f1", "tsk_f2"]
            assert tx.count(Task, follow_up_of=None) == 1
            assert [t.id for t in tx.find(Thread, token_id=None)] == ["thr_1"]
            assert [t.id for t in tx.find(Thread, token_id="tok_x")] == ["thr_2"]

    def test_find_limit(self, store: Store) -> None:
        with store.transaction() as tx:
            for n in range(1, 6):
                tx.put(run(f"run_{n}", "thr_a", n))
            assert [r.id for r in tx.find(Run, limit=2, thread_id="thr_a")] == ["run_1", "run_2"]
            assert len(tx.find(Run, limit=0)) == 0

    def test_runs_and_messages_are_ordered_by_seq_whatever_the_write_order(self, store: Store) -> None:
        with store.transaction() as tx:
            for n in (3, 1, 2):
                tx.put(run(f"run_{n}", "thr_a", n))
                tx.put(Message(f"msg_{n}", "thr_a", n, "user", str(n), AT))
        with store.transaction() as tx:
            assert [r.seq for r in tx.find(Run, thread_id="thr_a")] == [1, 2, 3]
            assert [m.seq for m in tx.find(Message, thread_id="thr_a")] == [1, 2, 3]

    def test_find_keeps_write_order_for_other_records(self, store: Store) -> None:
        with store.transaction() as tx:
            for name in ("c", "a", "b"):
                tx.put(item(f"bg_{name}", "thr_1"))
                tx.put(task(f"tsk_{name}"))
        with store.transaction() as tx:
            assert [i.id for i in tx.find(Item, thread_id="thr_1")] == ["bg_c", "bg_a", "bg_b"]
            assert [t.id for t in tx.find(Task, parent_thread_id="thr_p")] == ["tsk_c", "tsk_a", "tsk_b"]

    def test_tasks_are_found_by_their_parent_and_label(self, store: Store) -> None:
        with store.transaction() as tx:
            tx.put(task("tsk_a", label="build"))
            tx.put(task("tsk_b", label="test"))
            tx.put(task("tsk_c", parent="thr_q", label="build"))
            tx.put(task("tsk_d", label="build"))
            tx.put(task("tsk_e"))
        with store.read() as reader:
            found = reader.find(Task, parent_thread_id="thr_p", label="build")
            assert [t.id for t in found] == ["tsk_a", "tsk_d"]
            labels = [t.label for t in reader.find(Task, parent_thread_id="thr_p")]
            assert labels == ["build", "test", "build", None]

    def test_updating_a_record_does_not_move_it_in_find_order(self, store: Store) -> None:
        with store.transaction() as tx:
            for name in ("a", "b", "c"):
                tx.put(item(f"bg_{name}", "thr_1"))
                tx.put(task(f"tsk_{name}"))
                tx.put(thread(f"thr_{name}"))
        with store.transaction() as tx:
            tx.put(item("bg_a", "thr_1", awaited=True))
            tx.put(task("tsk_a", status=TaskStatus.COMPLETED))
            tx.put(thread("thr_a", settled=False))
        with store.transaction() as tx:
            assert [i.id for i in tx.find(Item, thread_id="thr_1")] == ["bg_a", "bg_b", "bg_c"]
            assert [t.id for t in tx.find(Task)] == ["tsk_a", "tsk_b", "tsk_c"]
            assert [t.id for t in tx.find(Thread)] == ["thr_a", "thr_b", "thr_c"]

    def test_find_on_a_field_that_is_not_indexed_is_refused(self, store: Store) -> None:
        with store.transaction() as tx, pytest.raises(ValueError):
            tx.find(Run, reply="x")
        with store.transaction() as tx, pytest.raises(ValueError):
            tx.count(Task, title="x")

    def test_count(self, store: Store) -> None:
        with store.transaction() as tx:
            assert tx.count(Item) == 0
            tx.put(item("bg_1", "thr_1", ItemKind.COMMAND))
            tx.put(item("bg_2", "thr_1", ItemKind.MONITOR, status="ended"))
            tx.put(item("bg_3", "thr_2", ItemKind.SCHEDULE, task_id=None))
            tx.put(item("bg_4", "thr_2", ItemKind.TASK, task_id="tsk_1"))
        with store.transaction() as tx:
            assert tx.count(Item) == 4
            assert tx.count(Item, thread_id="thr_1") == 2
            assert tx.count(Item, status="running") == 3
            assert tx.count(Item, kind=[ItemKind.COMMAND, ItemKind.MONITOR]) == 2
            assert tx.count(Item, task_id=None) == 3
            assert tx.count(Item, task_id="tsk_1", thread_id="thr_2") == 1

    def test_find_rows_is_find_undecoded(self, store: Store) -> None:
        with store.transaction() as tx:
            tx.put(run("run_2", "thr_1", 2))
            tx.put(run("run_1", "thr_1", 1))
            tx.put(run("run_3", "thr_2", 1))
        with store.read() as reader:
            rows = reader.find_rows(Run, thread_id="thr_1")
            assert [key for key, _ in rows] == [r.id for r in reader.find(Run, thread_id="thr_1")]
            assert [key for key, _ in rows] == ["run_1", "run_2"]
            assert [Run.from_dict(loads(text)) for _, text in rows] == reader.find(Run, thread_id="thr_1")

    def test_value_reads_one_indexed_column_of_one_record(self, store: Store) -> None:
        with store.transaction() as tx:
            tx.put(thread("thr_1", token_id="tok_1"))
            tx.put(thread("thr_2"))
        with store.read() as reader:
            assert reader.value(Thread, "thr_1", "token_id") == "tok_1"
            assert reader.value(Thread, "thr_2", "token_id") is None
            assert reader.value(Thread, "thr_none", "token_id") is None
            with pytest.raises(ValueError):
                reader.value(Thread, "thr_1", "title")

    def test_find_and_count_of_every_indexed_column(self, store: Store) -> None:
        records = samples()
        with store.transaction() as tx:
            for record in records:
                tx.put(record)
        with store.transaction() as tx:
            for record in records:
                table = TABLES[type(record)]
                for column in (table.key, *table.columns):
                    value = getattr(record, column)
                    found = tx.find(type(record), **{column: value})
                    assert record in found, (type(record).__name__, column)
                    assert tx.count(type(record), **{column: value}) == len(found)

    # ------------------------------------------------------------------ transactions

    def test_an_exception_rolls_everything_back(self, store: Store) -> None:
        with store.transaction() as tx:
            tx.put(thread("thr_keep"))
            tx.set_meta("k", "v1")
        events_before = store.last_event_seq()

        class Boom(Exception):
            pass

        with pytest.raises(Boom), store.transaction() as tx:
            tx.put(thread("thr_new"))
            tx.put(thread("thr_keep", title="changed"))
            tx.append_event("x", {})
            tx.add_outbox("k", {})
            tx.put_request("s", "k", {"r": 1})
            tx.set_meta("k", "v2")
            raise Boom
        assert store.last_event_seq() == events_before
        assert store.events_after(events_before) == []
        with store.transaction() as tx:
            assert tx.get(Thread, "thr_new") is None
            assert tx.get(Thread, "thr_keep").title is None
            assert tx.outbox() == []
            assert tx.get_request("s", "k") is None
            assert tx.get_meta("k") == "v1"

    def test_a_base_exception_rolls_back_too(self, store: Store) -> None:
        with pytest.raises(KeyboardInterrupt), store.transaction() as tx:
            tx.put(thread("thr_1"))
            raise KeyboardInterrupt
        with store.transaction() as tx:
            assert tx.get(Thread, "thr_1") is None

    def test_the_store_is_usable_after_a_rollback(self, store: Store) -> None:
        with pytest.raises(RuntimeError), store.transaction():
            raise RuntimeError("boom")
        with store.transaction() as tx:
            tx.put(thread("thr_1"))
        with store.transaction() as tx:
            assert tx.get(Thread, "thr_1") is not None

    def test_transactions_do_not_nest(self, store: Store) -> None:
        with store.transaction() as tx:
            tx.put(thread("thr_outer"))
            with pytest.raises(RuntimeError), store.transaction() as inner:
                inner.put(thread("thr_inner"))
            tx.put(thread("thr_after"))
        with store.transaction() as tx:
            assert tx.get(Thread, "thr_outer") is not None
            assert tx.get(Thread, "thr_after") is not None
            assert tx.get(Thread, "thr_inner") is None
        with store.transaction() as tx:  # and the refusal left no nesting behind
            assert tx.count(Thread) == 2

    def test_commit_is_visible_to_a_second_store_and_uncommitted_work_is_not(
        self, store: Store, location: Path
    ) -> None:
        other = self.make_store(location)
        try:
            with store.transaction() as tx:
                tx.put(thread("thr_1"))
                tx.append_event("thread.created", {"n": 1})
                assert other.events_after(0) == [], "no reader sees half a command"
            assert [e.type for e in other.events_after(0)] == ["thread.created"]
            with other.transaction() as tx:
                assert tx.get(Thread, "thr_1") is not None
        finally:
            other.close()

    # ------------------------------------------------------------------ events

    def test_events_are_appended_in_order_with_their_fields(self, store: Store) -> None:
        assert store.last_event_seq() == 0
        assert store.events_after(0) == []
        with store.transaction() as tx:
            first = tx.append_event("a", {"n": 1, "nested": {"x": [1, None]}}, thread_id="thr_1",
                                    run_id="run_1", task_id="tsk_1", token_id="tok_1")
            second = tx.append_event("b", {})
        with store.transaction() as tx:
            third = tx.append_event("c", {"n": 3})
        assert 0 < first < second < third
        assert store.last_event_seq() == third
        events = store.events_after(0)
        assert [e.seq for e in events] == [first, second, third]
        assert [e.type for e in events] == ["a", "b", "c"]
        a = events[0]
        assert (a.thread_id, a.run_id, a.task_id, a.token_id) == ("thr_1", "run_1", "tsk_1", "tok_1")
        assert a.data == {"n": 1, "nested": {"x": [1, None]}}
        assert a.id == str(first)
        assert a.at.endswith("Z") and a.at[:4].isdigit()
        b = events[1]
        assert (b.thread_id, b.run_id, b.task_id, b.token_id, b.data) == (None, None, None, None, {})

    def test_events_after_a_cursor_and_limit(self, store: Store) -> None:
        with store.transaction() as tx:
            seqs = [tx.append_event(f"e{n}", {"n": n}) for n in range(10)]
        assert [e.seq for e in store.events_after(seqs[4])] == seqs[5:]
        assert [e.seq for e in store.events_after(seqs[4], limit=2)] == seqs[5:7]
        assert store.events_after(seqs[-1]) == []
        assert len(store.events_after(0, limit=3)) == 3

    def test_events_after_of_some_types_and_prefixes(self, store: Store) -> None:
        with store.transaction() as tx:
            created = tx.append_event("task.created", {}, token_id="tok_a")
            tx.append_event("run.started", {}, token_id="tok_a")
            tx.append_event("task", {}, token_id="tok_a")  # no prefix match without the dot
            updated = tx.append_event("task.updated", {}, token_id="tok_a")
            tx.append_event("task.updated", {}, token_id="tok_b")
            added = tx.append_event("link.added", {})
            tx.append_event("link.status", {})
        assert [e.seq for e in store.events_after(0, types=["task."])] == [created, updated, updated + 1]
        assert [e.seq for e in store.events_after(0, token_id="tok_a", types=["task."])] == [created, updated]
        assert [e.seq for e in store.events_after(created, types=["task.", "link.added"])] == [
            updated, updated + 1, added,
        ]
        assert [e.seq for e in store.events_after(0, limit=1, types=["link.added"])] == [added]
        assert store.events_after(0, types=["thread."]) == []
        assert len(store.events_after(0, types=[])) == 7, "no types: every event"

    def test_events_after_with_a_token_shows_only_that_fence(self, store: Store) -> None:
        with store.transaction() as tx:
            a1 = tx.append_event("x", {}, token_id="tok_a")
            tx.append_event("x", {}, token_id="tok_b")
            tx.append_event("x", {})
            a2 = tx.append_event("x", {}, token_id="tok_a")
        assert [e.seq for e in store.events_after(0, token_id="tok_a")] == [a1, a2]
        assert [e.seq for e in store.events_after(a1, token_id="tok_a")] == [a2]
        assert store.events_after(0, token_id="tok_none") == []
        assert len(store.events_after(0)) == 4, "no token: every event"
        assert [e.seq for e in store.events_after(0, limit=1, token_id="tok_a")] == [a1]

    def test_prune_events_drops_only_older_events(self, store: Store) -> None:
        with store.transaction() as tx:
            old = [tx.append_event("x", {"n": n}) for n in range(3)]
        assert store.prune_events("2000-01-01T00:00:00.000Z") == 0
        assert len(store.events_after(0)) == 3
        assert store.prune_events("2999-01-01T00:00:00.000Z") == 3
        assert store.events_after(0) == []
        with store.transaction() as tx:
            new = tx.append_event("y", {})
        assert new > max(old), "sequence numbers are never reused, even after pruning"
        assert [e.seq for e in store.events_after(0)] == [new]
        assert [e.seq for e in store.events_after(max(old))] == [new]

    def test_prune_boundary_uses_the_event_time(self, store: Store) -> None:
        with store.transaction() as tx:
            tx.append_event("x", {})
        at = store.events_after(0)[0].at
        assert store.prune_events(at) == 0, "an event exactly at the cut-off is kept"
        assert len(store.events_after(0)) == 1

    # ------------------------------------------------------------------ outbox

    def test_outbox_add_list_remove_in_order(self, store: Store) -> None:
        with store.transaction() as tx:
            assert tx.outbox() == []
            ids = [tx.add_outbox("run.execute", {"runId": f"run_{n}"}) for n in range(5)]
        assert ids == sorted(ids) and len(set(ids)) == 5
        with store.transaction() as tx:
            rows = tx.outbox()
            assert [r.id for r in rows] == ids
            assert [r.kind for r in rows] == ["run.execute"] * 5
            assert [r.payload for r in rows] == [{"runId": f"run_{n}"} for n in range(5)]
            assert [r.id for r in tx.outbox(limit=2)] == ids[:2]
            tx.remove_outbox(ids[0])
            tx.remove_outbox(ids[3])
            tx.remove_outbox(999_999)  # unknown ids are harmless
        with store.transaction() as tx:
            assert [r.id for r in tx.outbox()] == [ids[1], ids[2], ids[4]]
            later = tx.add_outbox("process.kill", {"itemId": "bg_1"})
        assert later > max(ids)
        with store.transaction() as tx:
            assert tx.outbox()[-1].kind == "process.kill"

    def test_a_failed_row_waits_for_its_retry_time_and_keeps_its_error(self, store: Store) -> None:
        with store.transaction() as tx:
            first = tx.add_outbox("process.start", {"itemId": "bg_1"}, "thr_1")
            second = tx.add_outbox("run.execute", {"runId": "run_1"})
            assert tx.next_retry() is None, "no row has failed yet"
            tx.fail_outbox(first, "OSError: no such shell", retry_at=1000.0)
        with store.read() as reader:
            assert [r.id for r in reader.outbox(due=999.0)] == [second]
            assert [r.id for r in reader.outbox(due=1000.0)] == [first, second]
            assert [r.id for r in reader.outbox()] == [first, second], "without due: every unparked row"
            row = reader.outbox()[0]
            assert (row.thread_id, row.attempts, row.last_error, row.parked) == (
                "thr_1", 1, "OSError: no such shell", False)
            assert reader.next_retry() == 1000.0

    def test_a_parked_row_is_kept_and_listed_never_handed_out(self, store: Store) -> None:
        with store.transaction() as tx:
            row_id = tx.add_outbox("process.start", {"itemId": "bg_1"}, "thr_1")
            tx.add_outbox("process.start", {"itemId": "bg_2"}, "thr_2")
            tx.fail_outbox(row_id, "first", retry_at=5.0)
            tx.fail_outbox(row_id, "second", retry_at=None)
        with store.read() as reader:
            assert row_id not in [r.id for r in reader.outbox(due=10**12)]
            parked = reader.parked()
            assert [(r.id, r.attempts, r.last_error, r.parked) for r in parked] == [
                (row_id, 2, "second", True)]
            assert [r.id for r in reader.parked("thr_1")] == [row_id]
            assert reader.parked("thr_2") == []
            assert reader.next_retry() is None

    # ------------------------------------------------------------------ reads, ownership

    def test_a_read_sees_committed_commands_and_takes_no_write_lock(self, store: Store) -> None:
        with store.transaction() as tx:
            tx.put(thread("thr_1"))
        with store.read() as reader:
            assert reader.get(Thread, "thr_1") == thread("thr_1")
            assert [t.id for t in reader.find(Thread)] == ["thr_1"]
            assert reader.count(Thread) == 1
            assert not hasattr(reader, "put"), "a read cannot write"

    def test_a_failed_transaction_is_invisible_to_reads(self, store: Store) -> None:
        with pytest.raises(RuntimeError), store.transaction() as tx:
            tx.put(thread("thr_1"))
            tx.add_outbox("run.execute", {"runId": "run_1"})
            raise RuntimeError("the command failed half way")
        with store.read() as reader:
            assert reader.get(Thread, "thr_1") is None
            assert reader.outbox() == []

    def test_reads_and_transactions_do_not_nest(self, store: Store) -> None:
        with store.transaction(), pytest.raises(RuntimeError, match="do not nest"), store.read():
            pass
        with store.read(), pytest.raises(RuntimeError, match="do not nest"), store.transaction():
            pass

    def test_the_store_refuses_a_thread_that_does_not_own_it(self, store: Store) -> None:
        with store.transaction() as tx:
            tx.put(thread("thr_1"))
        uses = {
            "transaction": lambda: store.transaction().__enter__(),
            "read": lambda: store.read().__enter__(),
            "events_after": lambda: store.events_after(0),
            "last_event_seq": store.last_event_seq,
        }
        refused: dict[str, BaseException | None] = {}
        for name, use in uses.items():
            def attempt(name: str = name, use: Callable[[], Any] = use) -> None:
                try:
                    use()
                    refused[name] = None
                except BaseException as error:
                    refused[name] = error
            worker = threading.Thread(target=attempt)
            worker.start()
            worker.join()
        assert {name: type(error) for name, error in refused.items()} == dict.fromkeys(uses, ForeignThread)
        with store.read() as reader:  # the owner still can
            assert reader.get(Thread, "thr_1") is not None

    # ------------------------------------------------------------------ requests, meta

    def test_requests_record_the_first_outcome_per_scope_and_key(self, store: Store) -> None:
        with store.transaction() as tx:
            assert tx.get_request("admin::", "create_thread:k1") is None
            tx.put_request("admin::", "create_thread:k1", {"threadId": "thr_1", "runId": None})
        with store.transaction() as tx:
            assert tx.get_request("admin::", "create_thread:k1") == {"threadId": "thr_1", "runId": None}
            assert tx.get_request("link:tok:", "create_thread:k1") is None, "scopes are separate"
            assert tx.get_request("admin::", "create_thread:k2") is None
            tx.put_request("link:tok:", "create_thread:k1", {"threadId": "thr_2"})
        with store.transaction() as tx:
            assert tx.get_request("admin::", "create_thread:k1") == {"threadId": "thr_1", "runId": None}
            assert tx.get_request("link:tok:", "create_thread:k1") == {"threadId": "thr_2"}

    def test_meta(self, store: Store) -> None:
        with store.transaction() as tx:
            assert tx.get_meta("environment_id") is None
            tx.set_meta("environment_id", "env_1")
            tx.set_meta("name", "laptop")
        with store.transaction() as tx:
            assert tx.get_meta("environment_id") == "env_1"
            tx.set_meta("name", "desktop")
        with store.transaction() as tx:
            assert tx.get_meta("name") == "desktop"

    # ------------------------------------------------------------------ schema, durability

    def test_reopening_keeps_data_and_does_not_migrate_again(self, location: Path) -> None:
        first = self.make_store(location)
        with first.transaction() as tx:
            for record in samples():
                tx.put(record)
            tx.set_meta("environment_id", "env_1")
            tx.put_request("s", "k", {"ok": True})
            tx.add_outbox("run.execute", {"runId": "run_1"})
            seq = tx.append_event("e", {"x": 1})
        first.close()
        second = self.make_store(location)
        try:
            with second.transaction() as tx:
                for record in samples():
                    key = getattr(record, TABLES[type(record)].key)
                    assert tx.get(type(record), key) == record
                assert tx.get_meta("environment_id") == "env_1"
                assert tx.get_request("s", "k") == {"ok": True}
                assert [r.payload for r in tx.outbox()] == [{"runId": "run_1"}]
            assert second.last_event_seq() == seq
            with second.transaction() as tx:
                assert tx.append_event("f", {}) > seq
        finally:
            second.close()
