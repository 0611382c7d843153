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

import os
import time
from pathlib import Path
from typing import Any

import psutil

from tether import __version__
from tether.config import default_deadline_ms, load_config, section
from tether.engine.port import Services
from tether.engine.queries import Queries
from tether.engine.runtime import Runtime
from tether.engine.tokens import Tokens, new_admin_token
from tether.errors import Forbidden
from tether.ids import new_id
from tether.peers import Origin, Peers
from tether.private import write_private
from tether.providers import Provider, load_providers
from tether.store import open_store
from tether.tools.surface import Tools
from tether.types import Caller


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
        self.tokens = Tokens(self.commands, self.admin_token)
        self.commands.default_deadline_ms = default_deadline_ms(self.config)
        self.queries = Queries(self.commands)
        self.peers = Peers(Origin(environment_id, self.commands, self.config))
        self.runtime.add_handler("peer.push", self.peers.on_push)
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
                    token = new_admin_token()
                    tx.set_meta("admin_token", token)
        elif path.exists():
            return path.read_text().strip()
        else:
            token = new_admin_token()
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
            # Background commands' wrappers (and any other child) once reaped: on a small
            # machine they compete with the server for the same cores.
            "childCpuSeconds": round(_children_cpu(), 3),
            # What it wrote to files (the store's log and its checkpoints, the commands'
            # pid files); None where the platform does not count it.
            "bytesWritten": _bytes_written(),
        }

    async def start(self) -> None:
        await self.runtime.start(self.services)
        await self.peers.start()

    async def close(self) -> None:
        await self.peers.close()
        await self.runtime.close()
        self.store.close()

    def thread_credential(self, thread_id: str, label: str, ttl_seconds: int) -> tuple[str, str] | None:
        """``(mcp url, token)``: a fresh credential of ``thread_id`` for an agent that runs
        out of process; None while this environment's URL is not known."""
        if not self.base_url:
            return None
        _, token = self.tokens.mint(label, "thread", thread_id, ttl_seconds)
        return f"{self.base_url}/mcp", token


def _bytes_written() -> int | None:
    read = getattr(psutil.Process(), "io_counters", None)  # not on macOS
    try:
        counters = read() if read is not None else None
    except psutil.Error:
        return None
    return None if counters is None else int(getattr(counters, "write_chars", counters.write_bytes))


def _children_cpu() -> float:
    times = os.times()
    return times.children_user + times.children_system
