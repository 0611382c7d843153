"""One environment: its data directory, store, identity, tokens and runtime — and the one
place that assembles the parts (commands and runtime, queries, links, tools, what turns
are lent); each part gets what it uses, none reaches back for the rest.

The data directory holds ``tether.db`` (the SQLite store), ``admin.token`` (mode 0600),
``workspace/`` (where commands run) and ``proc/`` (background process files). With a
PostgreSQL store (``store="postgresql://…"``, SPEC §12) the environment lives in the
database, shared by every process serving it, and the directory holds only this process's
own files.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tether import __version__
from tether.config import default_deadline_ms, load_config, section
from tether.domain.records import Thread, Token
from tether.engine.port import Services
from tether.engine.queries import Queries
from tether.engine.runtime import Runtime
from tether.errors import Forbidden, NotFound, Unauthorized
from tether.ids import format_time, new_id, now
from tether.peers import Peers
from tether.private import write_private
from tether.providers import Provider, load_providers
from tether.store import open_store
from tether.tools.surface import Tools
from tether.types import ADMIN, Caller

#: How often a token's use is written down (seconds): ``lastUsedAt`` is at most this stale.
USE_INTERVAL = 60.0


def _new_admin_token() -> str:
    return "tta_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Environment:
    def __init__(
        self,
        data_dir: Path,
        name: str | None = None,
        providers: dict[str, Provider] | None = None,
        store: str | None = None,
    ) -> None:
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        self.config = load_config(data_dir)
        self.store = open_store(store or data_dir / "tether.db")
        with self.store.transaction() as tx:
            environment_id = tx.get_meta("environment_id")
            if environment_id is None:
                environment_id = new_id("env")
                tx.set_meta("environment_id", environment_id)
            if name:
                tx.set_meta("name", name)
            self.name = tx.get_meta("name") or data_dir.resolve().name
        self.environment_id = environment_id
        self.admin_token = self._admin_token()
        self._last_use: dict[str, float] = {}
        self.runtime = Runtime(
            self.store,
            environment_id,
            data_dir,
            providers or load_providers(self.config),
            retention_days=float(section(self.config, "events").get("retention_days", 7)),
        )
        #: Where this environment's API and ``/mcp`` answer (set by ``tether serve``).
        self.base_url: str | None = None
        self.commands = self.runtime.commands
        self.commands.default_deadline_ms = default_deadline_ms(self.config)
        self.queries = Queries(self.commands)
        self.peers = Peers(self)
        self.tools = Tools(self.commands, self.queries, self.runtime.notifier, self.name, self.peers)
        #: What every provider turn is lent (``tether.engine.port``).
        self.services = Services(
            commands=self.commands,
            tools=self.tools,
            workspace=self.runtime.workspace,
            shell=self.runtime.processes.backend,
            view=self.commands.view,
            data_dir=data_dir,
            credentials=self,
        )

    def _admin_token(self) -> str:
        """Written before the server listens, readable by its owner only (every platform).
        A store shared by several processes keeps it, so every process of the environment
        writes the same one (SPEC §12); its first process makes it."""
        path = self.data_dir / "admin.token"
        if self.store.shared:
            with self.store.transaction() as tx:
                token = tx.get_meta("admin_token")
                if token is None:
                    token = _new_admin_token()
                    tx.set_meta("admin_token", token)
        elif path.exists():
            return path.read_text().strip()
        else:
            token = _new_admin_token()
        write_private(path, token + "\n")
        return token

    def health(self) -> dict[str, Any]:
        return {
            "environmentId": self.environment_id,
            "name": self.name,
            "version": __version__,
            "processes": self.runtime.processes.backend.name,
        }

    def stats(self, caller: Caller) -> dict[str, Any]:
        if caller.kind != "admin":
            raise Forbidden("only the admin token can read the stats")
        return {
            "transactions": self.store.commits,
            "events": self.store.last_event_seq(),
            "cpuSeconds": round(time.process_time(), 3),
        }

    async def start(self) -> None:
        await self.runtime.start(self.services)
        await self.peers.start()

    async def close(self) -> None:
        await self.peers.close()
        await self.runtime.close()
        self.store.close()

    # ------------------------------------------------------------------ tokens

    def authenticate(self, token: str | None) -> Caller:
        """Who holds ``token``. A read: it takes no write lock, so thousands of requests a
        second do not queue behind commands; token use is recorded by :meth:`_used`."""
        if not token:
            raise Unauthorized("missing bearer token (Authorization: Bearer <token>)")
        if hmac.compare_digest(token, self.admin_token):
            return ADMIN
        with self.store.read() as reader:
            found = reader.find(Token, hash=hash_token(token))
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
        """Record that a token was used — at most once per ``USE_INTERVAL`` per token, as a
        write with its event, so ``lastUsedAt`` is at most that stale and a busy peer costs
        one write a minute, not one per request."""
        at = time.monotonic()
        if at - self._last_use.get(record.id, -USE_INTERVAL) < USE_INTERVAL:
            return
        self._last_use[record.id] = at
        with self.store.transaction() as tx:
            current = tx.get(Token, record.id)
            if current is None:
                return
            current.last_used_at = now()
            tx.put(current)
            tx.append_event("token.used", {"tokenId": current.id, "lastUsedAt": current.last_used_at})

    def mint_token(
        self, label: str, kind: str = "link", thread_id: str | None = None, ttl_seconds: int | None = None
    ) -> tuple[Token, str]:
        secret = ("ttl_" if kind == "link" else "ttc_") + secrets.token_urlsafe(32)
        expires = format_time(datetime.now(UTC) + timedelta(seconds=ttl_seconds)) if ttl_seconds else None
        record = Token(new_id("tok"), label, hash_token(secret), now(), kind, thread_id, expires)
        with self.store.transaction() as tx:
            if thread_id is not None and tx.get(Thread, thread_id) is None:
                raise NotFound(f"no thread with id {thread_id!r}")
            tx.put(record)
        return record, secret

    def thread_credential(self, thread_id: str, label: str, ttl_seconds: int) -> tuple[str, str] | None:
        """``(mcp url, token)``: a fresh credential of ``thread_id`` for an agent that runs
        out of process; None while this environment's URL is not known."""
        if not self.base_url:
            return None
        _, token = self.mint_token(label, "thread", thread_id, ttl_seconds)
        return f"{self.base_url}/mcp", token

    def token_active(self, token_id: str) -> bool:
        with self.store.read() as reader:
            record = reader.get(Token, token_id)
        return record is not None and not record.revoked

    def acknowledge(self, token_id: str, seq: int) -> None:
        """A peer read its feed from ``seq``: everything up to it has reached it (G7)."""
        with self.store.transaction() as tx:
            record = tx.get(Token, token_id)
            if record is not None and seq > record.acked_seq:
                record.acked_seq = seq
                tx.put(record)

    def tokens(self, kind: str = "link") -> list[Token]:
        with self.store.read() as reader:
            return reader.find(Token, kind=kind)

    def revoke_token(self, token_id: str) -> Token:
        with self.store.transaction() as tx:
            record = tx.get(Token, token_id)
            if record is None or record.kind != "link":
                raise NotFound(f"no link token with id {token_id!r}")
            record.revoked = True
            tx.put(record)
        return record
