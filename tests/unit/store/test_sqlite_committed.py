"""The records as last committed (``store/sqlite/committed.py``): a read by key that skips
SQLite must still answer what SQLite would — after commits, rollbacks, and commits by
another connection to the same file."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from contract import thread
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.domain.records import Thread
from tether.store.sqlite import SQLiteStore, committed


class Boom(Exception):
    pass


def title(store: SQLiteStore, key: str) -> str | None:
    with store.read() as reader:
        record = reader.get(Thread, key)
    return None if record is None else (record.title or "")


def test_a_commit_by_another_connection_is_read(tmp_path: Path) -> None:
    ours, other = SQLiteStore(tmp_path / "t.db"), SQLiteStore(tmp_path / "t.db")
    try:
        with ours.transaction() as tx:
            tx.put(thread("thr_1", title="ours"))
        assert title(ours, "thr_1") == "ours"  # now held
        with other.transaction() as tx:
            tx.put(thread("thr_1", title="theirs"))
        assert title(ours, "thr_1") == "theirs"
    finally:
        other.close()
        ours.close()


def test_a_full_cache_forgets_and_still_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(committed, "LIMIT", 3)
    store = SQLiteStore(tmp_path / "t.db")
    try:
        with store.transaction() as tx:
            for n in range(5):
                tx.put(thread(f"thr_{n}", title=str(n)))
        assert [title(store, f"thr_{n}") for n in range(5)] == [str(n) for n in range(5)]
    finally:
        store.close()


_KEYS = st.sampled_from(["thr_a", "thr_b", "thr_c"])
_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), _KEYS, st.text(max_size=3), st.booleans()),  # ours, commit or roll back
        st.tuples(st.just("foreign"), _KEYS, st.text(max_size=3), st.just(True)),  # another connection
        st.tuples(st.just("read"), _KEYS, st.just(""), st.just(True)),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(steps=_STEPS)
def test_reads_by_key_match_a_model_of_what_committed(steps: list[tuple[str, str, str, bool]]) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        ours, other = SQLiteStore(Path(scratch) / "t.db"), SQLiteStore(Path(scratch) / "t.db")
        model: dict[str, str] = {}
        try:
            for action, key, text, commits in steps:
                if action == "read":
                    assert title(ours, key) == model.get(key)
                    continue
                store = ours if action == "put" else other
                try:
                    with store.transaction() as tx:
                        tx.put(thread(key, title=text))
                        assert tx.get(Thread, key).title == text  # its own put, read back
                        if not commits:
                            raise Boom
                except Boom:
                    continue
                model[key] = text
            for key in ("thr_a", "thr_b", "thr_c"):
                assert title(ours, key) == model.get(key)
        finally:
            other.close()
            ours.close()
