"""The record kinds and their tables (the part of ``tether.store.base`` every backend shares)."""

from __future__ import annotations

from contract import samples

from tether.domain.records import Item, Link, Message, Run, Send, Task, Thread, Token
from tether.store.base import TABLES


def test_every_record_kind_has_a_table() -> None:
    assert set(TABLES) == {Thread, Run, Message, Item, Task, Token, Link, Send}
    assert {type(r) for r in samples()} == set(TABLES)
