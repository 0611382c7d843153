"""Tokens: who may call this environment, and the commands that change them.

Three kinds of bearer token reach the API (SPEC §10): the admin token (kept in the data
directory, or in a shared store), link tokens an admin mints for another environment, and
thread credentials minted for an agent running out of process. Only a hash of a minted
token is stored; the secret is shown once. Minting, revoking, recording use and the feed
position a peer acknowledged are commands like any other (one transaction each, with
their event), so the event feed shows every change and nothing writes the store behind
the engine's back.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from tether.domain.records import Thread, Token
from tether.engine.commands import Commands
from tether.errors import NotFound, Unauthorized
from tether.ids import format_time, new_id, now
from tether.types import ADMIN, Caller

#: How often a token's use is written down (seconds): ``lastUsedAt`` is at most this stale.
USE_INTERVAL = 60.0


def new_admin_token() -> str:
    return "tta_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_view(record: Token) -> dict[str, Any]:
    """A link token as the API and the page list it (never its hash)."""
    return {
        "tokenId": record.id,
        "label": record.label,
        "createdAt": record.created_at,
        "lastUsedAt": record.last_used_at,
        "revoked": record.revoked,
        "ackedEventId": str(record.acked_seq),
    }


class Tokens:
    """The environment's tokens, read on the read path and changed through commands."""

    def __init__(self, commands: Commands, admin_token: str) -> None:
        self.commands = commands
        self.admin_token = admin_token
        self._last_use: dict[str, float] = {}

    def authenticate(self, token: str | None) -> Caller:
        """Who holds ``token``. A read: it takes no write lock, so thousands of requests a
        second do not queue behind commands; use is recorded by :meth:`_used`, coalesced."""
        if not token:
            raise Unauthorized("missing bearer token (Authorization: Bearer <token>)")
        if hmac.compare_digest(token, self.admin_token):
            return ADMIN
        with self.commands.snapshot() as u:
            found = u.query(Token, hash=hash_token(token))
        record = found[0] if found else None
        if record is None or record.revoked:
            raise Unauthorized("invalid or revoked token")
        if record.expires_at and record.expires_at < now():
            raise Unauthorized("token expired")
        self._used(record)
        if record.kind == "thread":
            return Caller("thread", thread_id=record.thread_id)
        return Caller("link", token_id=record.id)

    def _used(self, record: Token) -> None:
        """Record that a token was used — at most once per ``USE_INTERVAL`` per token, so
        ``lastUsedAt`` is at most that stale and a busy peer costs one write a minute."""
        at = time.monotonic()
        if at - self._last_use.get(record.id, -USE_INTERVAL) < USE_INTERVAL:
            return
        self._last_use[record.id] = at
        with self.commands.unit() as u:
            current = u.load(Token, record.id)
            if current is None:
                return
            current.last_used_at = u.at
            u.save(current)
            u.emit("token.used", {"tokenId": current.id, "lastUsedAt": current.last_used_at})

    def mint(
        self, label: str, kind: str = "link", thread_id: str | None = None, ttl_seconds: int | None = None
    ) -> tuple[Token, str]:
        """A new token: its record and the secret, which is not kept (only its hash)."""
        secret = ("ttl_" if kind == "link" else "ttc_") + secrets.token_urlsafe(32)
        expires = format_time(datetime.now(UTC) + timedelta(seconds=ttl_seconds)) if ttl_seconds else None
        with self.commands.unit() as u:
            if thread_id is not None and u.load(Thread, thread_id) is None:
                raise NotFound(f"no thread with id {thread_id!r}")
            record = Token(new_id("tok"), label, hash_token(secret), u.at, kind, thread_id, expires)
            u.save(record)
            data = {"tokenId": record.id, "label": label, "kind": kind, "threadId": thread_id}
            u.emit("token.minted", data)
        return record, secret

    def active(self, token_id: str) -> bool:
        with self.commands.snapshot() as u:
            record = u.load(Token, token_id)
        return record is not None and not record.revoked

    def acknowledge(self, token_id: str, seq: int) -> None:
        """A peer read its feed from ``seq``: everything up to it has reached it (G7). A
        cursor, like a link's: it gets no event of its own (the feed would feed itself)."""
        if seq <= self._acked(token_id):
            return  # nothing new: no transaction
        with self.commands.unit() as u:
            record = u.load(Token, token_id)
            if record is not None and seq > record.acked_seq:
                record.acked_seq = seq
                u.save(record)

    def _acked(self, token_id: str) -> int:
        with self.commands.snapshot() as u:
            record = u.load(Token, token_id)
        return record.acked_seq if record is not None else 1 << 62

    def list(self, kind: str = "link") -> list[Token]:
        with self.commands.view() as u:
            return u.query(Token, kind=kind)

    def revoke(self, token_id: str) -> Token:
        with self.commands.unit() as u:
            record = u.load(Token, token_id)
            if record is None or record.kind != "link":
                raise NotFound(f"no link token with id {token_id!r}")
            record.revoked = True
            u.save(record)
            u.emit("token.revoked", {"tokenId": record.id})
        return record
