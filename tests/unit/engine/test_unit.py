"""A unit of work hands back one object per record (its identity map), so two helpers of
one command can never hold two copies of a thread and undo each other's change; it writes
behind (a query still sees what was saved), an ``*.updated`` event replaces its
predecessor for the same record, and events carry the thread's fence token and name the
keys to wake."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tether.domain.records import Thread
from tether.engine.unit import Unit, View
from tether.store.sqlite import SQLiteStore

AT = "2026-01-01T00:00:00.000Z"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "tether.db")
    with store.transaction() as tx:
        tx.put(Thread("thr_a", "script", AT, title="a", token_id="tok_1"))
        tx.put(Thread("thr_b", "script", AT, title="b"))
    yield store
    store.close()


def test_load_and_query_hand_back_the_same_object(store: SQLiteStore) -> None:
    with store.transaction() as tx:
        u = Unit(tx, "env")
        loaded = u.need(Thread, "thr_a", "thread")
        assert u.load(Thread, "thr_a") is loaded
        assert next(t for t in u.query(Thread) if t.id == "thr_a") is loaded


def test_a_change_saved_by_one_helper_is_what_the_next_one_reads(store: SQLiteStore) -> None:
    with store.transaction() as tx:
        u = Unit(tx, "env")
        first = u.need(Thread, "thr_a", "thread")
        first.title = "renamed"
        u.save(first)
        second = u.query(Thread, token_id="tok_1")[0]  # a query of the store, after the save
        second.status = "running"
        u.save(second)
        u.write()
    with store.read() as reader:
        stored = reader.get(Thread, "thr_a")
    assert stored is not None and (stored.title, stored.status) == ("renamed", "running")


def test_an_event_carries_the_threads_fence_token_and_names_what_to_wake(store: SQLiteStore) -> None:
    with store.transaction() as tx:
        u = Unit(tx, "env")
        u.emit("thread.updated", {}, thread_id="thr_a", task_id="tsk_1")
        u.emit("thread.updated", {}, thread_id="thr_b")
        u.outbox("run.execute", {"runId": "run_1"}, "thr_a")
        u.write()
        touched = set(u.touched)
    assert touched == {"events", "thread:thr_a", "thread:thr_b", "task:tsk_1", "outbox"}
    assert [e.token_id for e in store.events_after(0)] == ["tok_1", None]


def test_a_query_sees_a_saved_change_through_its_filter_columns(store: SQLiteStore) -> None:
    with store.transaction() as tx:
        u = Unit(tx, "env")
        thread = u.need(Thread, "thr_b", "thread")
        thread.token_id = "tok_2"
        u.save(thread)
        assert [t.id for t in u.query(Thread, token_id="tok_2")] == ["thr_b"]
        assert u.count(Thread, token_id="tok_1") == 1


def test_only_the_last_update_of_a_record_is_appended_in_order(store: SQLiteStore) -> None:
    with store.transaction() as tx:
        u = Unit(tx, "env")
        u.emit("task.updated", {"n": 1}, thread_id="thr_a", task_id="tsk_1")
        u.emit("task.delivery", {"n": 2}, thread_id="thr_a", task_id="tsk_1")
        u.emit("task.updated", {"n": 3}, thread_id="thr_a", task_id="tsk_2")
        u.emit("task.delivery", {"n": 4}, thread_id="thr_a", task_id="tsk_1")
        u.emit("task.updated", {"n": 5}, thread_id="thr_a", task_id="tsk_1")
        u.write()
    events = store.events_after(0)
    assert [(e.type, e.data["n"]) for e in events] == [
        ("task.delivery", 2),
        ("task.updated", 3),
        ("task.delivery", 4),
        ("task.updated", 5),
    ]


def test_a_unit_that_raises_leaves_nothing_behind(store: SQLiteStore) -> None:
    with pytest.raises(RuntimeError), store.transaction() as tx:
        u = Unit(tx, "env")
        thread = u.need(Thread, "thr_a", "thread")
        thread.title = "half-applied"
        u.save(thread)
        u.emit("thread.updated", {}, thread_id="thr_a")
        raise RuntimeError("the command failed")
    with store.read() as reader:
        stored = reader.get(Thread, "thr_a")
    assert stored is not None and stored.title == "a"
    assert store.events_after(0) == []


def test_a_view_reads_each_record_once_from_its_snapshot(store: SQLiteStore) -> None:
    with store.read() as reader:
        view = View(reader, "env")
        assert view.load(Thread, "thr_b") is view.load(Thread, "thr_b")
        assert view.load(Thread, None) is None
