"""Tokens are changed by commands with their events, never behind the engine's back, and
their use is recorded coalesced (at most once a minute per token), not per request."""

from __future__ import annotations

import pytest
from tether_world import World

from tether.engine.tokens import Tokens
from tether.errors import NotFound, Unauthorized
from tether.types import ADMIN, Caller


def token_events(world: World) -> list[tuple[str, dict[str, object]]]:
    return [(e.type, e.data) for e in world.store.events_after(0) if e.type.startswith("token.")]


def test_minting_using_and_revoking_are_commands_with_events(world: World) -> None:
    tokens = Tokens(world.commands, "tta_admin")
    record, secret = tokens.mint("for b")
    assert tokens.authenticate(secret) == Caller("link", token_id=record.id)
    assert tokens.authenticate(secret) == Caller("link", token_id=record.id)  # within the minute
    tokens.revoke(record.id)
    events = token_events(world)
    assert [kind for kind, _ in events] == ["token.minted", "token.used", "token.revoked"]
    assert secret not in str(events) and record.hash not in str(events)
    with pytest.raises(Unauthorized, match="revoked"):
        tokens.authenticate(secret)
    assert tokens.active(record.id) is False
    assert [t.last_used_at is not None for t in tokens.list()] == [True]


def test_the_admin_token_and_bad_tokens(world: World) -> None:
    tokens = Tokens(world.commands, "tta_admin")
    assert tokens.authenticate("tta_admin") == ADMIN
    for bad, words in ((None, "missing"), ("", "missing"), ("ttl_nope", "invalid")):
        with pytest.raises(Unauthorized, match=words):
            tokens.authenticate(bad)
    with pytest.raises(NotFound):
        tokens.mint("cred", "thread", thread_id="thr_missing")
    with pytest.raises(NotFound):
        tokens.revoke("tok_missing")
    assert token_events(world) == []  # refused: nothing changed


def test_a_thread_credential_acts_as_its_thread(world: World) -> None:
    thread = world.commands.create_thread(ADMIN, "script", "t")
    tokens = Tokens(world.commands, "tta_admin")
    record, secret = tokens.mint("cred", "thread", thread["threadId"], 60)
    assert tokens.authenticate(secret) == Caller("thread", thread_id=thread["threadId"])
    assert record.expires_at is not None and secret.startswith("ttc_")


def test_acknowledging_moves_forward_only_and_costs_nothing_when_nothing_is_new(world: World) -> None:
    tokens = Tokens(world.commands, "tta_admin")
    record, _ = tokens.mint("for b")
    tokens.acknowledge(record.id, 7)
    before = world.commits
    tokens.acknowledge(record.id, 7)
    tokens.acknowledge(record.id, 3)
    assert world.commits == before
    assert tokens.list()[0].acked_seq == 7
