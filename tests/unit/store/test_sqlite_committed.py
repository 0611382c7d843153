"""The records as last committed (``store/sqlite/committed.py``): a read by key that skips
SQLite must still answer what SQLite would — after commits, rollbacks, and commits by
another connection to the same file — and an update that sets only the columns it knows
changed must leave every filter column as the record says."""

from __future__ import annotations

import sqlite3
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


def fence(store: SQLiteStore, key: str) -> str | None:
    """The column read alone (``value``): answered from the cache once the row is held."""
    with store.read() as reader:
        return reader.value(Thread, key, "token_id")


def test_a_commit_by_another_connection_is_read(tmp_path: Path) -> None:
    ours, other = SQLiteStore(tmp_path / "t.db"), SQLiteStore(tmp_path / "t.db")
    try:
        with ours.transaction() as tx:
            tx.put(thread("thr_1", title="ours"))
        assert title(ours, "thr_1") == "ours"  # now held
        assert fence(ours, "thr_1") is None
        with other.transaction() as tx:
            tx.put(thread("thr_1", title="theirs", token_id="tok_theirs"))
        assert title(ours, "thr_1") == "theirs"
        assert fence(ours, "thr_1") == "tok_theirs"
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
        # Few texts, so that a put often leaves its filter column (token_id) as it was.
        st.tuples(st.just("put"), _KEYS, st.text("ab", max_size=2), st.booleans()),  # ours: commit or not
        st.tuples(st.just("foreign"), _KEYS, st.text("ab", max_size=2), st.just(True)),  # another connection
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
                    assert fence(ours, key) == _token(model.get(key) or "")
                    continue
                store = ours if action == "put" else other
                try:
                    with store.transaction() as tx:
                        tx.put(thread(key, token_id=_token(text), title=text))
                        assert tx.get(Thread, key).title == text  # its own put, read back
                        assert tx.value(Thread, key, "token_id") == _token(text)
                        if not commits:
                            raise Boom
                except Boom:
                    continue
                model[key] = text
            for key in ("thr_a", "thr_b", "thr_c"):
                assert title(ours, key) == model.get(key)
            _assert_columns_match(Path(scratch) / "t.db", ours, model)
        finally:
            other.close()
            ours.close()


def _token(text: str) -> str | None:
    return f"tok_{text[:1]}" if text else None


def _assert_columns_match(path: Path, store: SQLiteStore, model: dict[str, str]) -> None:
    """Every row's token_id column is its record's, and a find by it finds the model's."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT id, token_id, json_extract(data, '$.token_id') FROM threads").fetchall()
    assert {key: column for key, column, _ in rows} == {key: _token(text) for key, text in model.items()}
    assert all(column == in_data for _, column, in_data in rows), rows
    with store.read() as reader:
        for token in {_token(text) for text in model.values()} - {None}:
            found = {t.id for t in reader.find(Thread, token_id=token)}
            assert found == {key for key, text in model.items() if _token(text) == token}
