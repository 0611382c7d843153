"""The runtime: carries out the outbox after each commit, and recovers on start.

Outbox rows are side effects a command decided on: start a provider turn, spawn or kill a
process, arm a timer, call a peer. A row is removed only after its handler ran, and every
handler is idempotent (it re-reads the record and does nothing if the moment has passed),
so a crash between commit and side effect just means the row is handled on the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tether.domain.records import Item, Message, Run, Thread
from tether.domain.types import ItemKind, ItemStatus, RunStatus
from tether.engine.commands import Commands
from tether.engine.notify import Notifier
from tether.engine.processes import ProcessManager
from tether.errors import Conflict
from tether.ids import format_time, parse_time
from tether.store.base import OutboxRow, Store

log = logging.getLogger(__name__)

OutboxHandler = Callable[[OutboxRow], Awaitable[None] | None]


class Runtime:
    def __init__(
        self,
        store: Store,
        environment_id: str,
        data_dir: Path,
        providers: dict[str, Any],
        retention_days: float = 7.0,
    ) -> None:
        self.store = store
        self.environment_id = environment_id
        self.providers = providers
        self.notifier = Notifier()
        self.commands = Commands(store, environment_id, providers, self._committed)
        self.workspace = data_dir / "workspace"
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.processes = ProcessManager(data_dir / "proc", self.workspace, self._lines, self._exited)
        self.handlers: dict[str, OutboxHandler] = {
            "run.execute": self._execute,
            "run.stop": self._stop_run,
            "process.start": self._spawn,
            "process.kill": self._kill,
            "timer.arm": self._arm,
        }
        self._turns: dict[str, asyncio.Task[None]] = {}
        self._drain_task: asyncio.Task[None] | None = None
        self._drain_again = False
        self._timer_wakeup = asyncio.Event()
        self._timer_task: asyncio.Task[None] | None = None
        self._started = False
        self._retention = timedelta(days=retention_days)
        self._housekeeping: asyncio.Task[None] | None = None
        #: Set by the environment: the tool surface (handed to turns) and the environment
        #: itself (providers that run agents out of process mint thread credentials with it).
        self.tools: Any = None
        self.environment: Any = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Recover (G6), then start carrying out the outbox and the timers."""
        exited: dict[str, int | None] = {}
        lost: list[str] = []
        adopt: list[tuple[Item, int]] = []
        pending_spawns = {row.payload["itemId"] for row in self._outbox() if row.kind == "process.start"}
        with self.store.transaction() as tx:
            items = tx.find(
                Item, status=ItemStatus.RUNNING, kind=[ItemKind.COMMAND, ItemKind.MONITOR, ItemKind.AGENT]
            )
        agent_run = self._agent_run([i for i in items if i.runner is not None], lost)
        for item in items:
            if item.runner is not None:
                continue  # run by an agent, not by tether: its provider adopts it below
            if item.id in pending_spawns and not self.processes.spawned_before(item.id):
                continue  # never spawned: its process.start row will do it
            fate, value = self.processes.fate(item)
            if fate == "alive" and value is not None:
                adopt.append((item, value))
            elif fate == "exited":
                exited[item.id] = value
            else:
                lost.append(item.id)
        self.commands.recover(exited, lost)
        self._started = True
        for item, pid in adopt:
            self.processes.watch(item, pid)
        for adopter, its in agent_run:
            adopter(self, its)
        self._timer_task = asyncio.create_task(self._timers(), name="timers")
        self._housekeeping = asyncio.create_task(self._prune(), name="prune events")
        self._kick()
        if self._drain_task is not None:
            await asyncio.shield(self._drain_task)

    def _agent_run(self, items: list[Item], lost: list[str]) -> list[tuple[Callable[..., None], list[Item]]]:
        """Background work an agent runs itself (``spawn=False``) has no process of tether's
        to look at: its provider adopts it (``provider.adopt(runtime, items)``: it reports each
        item's end, as the agent reports it, once it knows). Items of a provider that cannot
        adopt are ``lost``."""
        by_runner: dict[str, list[Item]] = {}
        for item in items:
            by_runner.setdefault(str(item.runner), []).append(item)
        adopters = []
        for runner, its in by_runner.items():
            adopter = getattr(self.providers.get(runner), "adopt", None)
            if adopter is None:
                lost.extend(item.id for item in its)
            else:
                adopters.append((adopter, its))
        return adopters

    async def close(self) -> None:
        """Stop our own tasks. Runs left running are marked interrupted at the next start."""
        self._started = False
        own = (self._timer_task, self._housekeeping, self._drain_task, *self._turns.values())
        tasks = [t for t in own if t]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.processes.close()
        for provider in self.providers.values():
            with contextlib.suppress(Exception):
                await provider.close()

    def add_handler(self, kind: str, handler: OutboxHandler) -> None:
        self.handlers[kind] = handler

    # ------------------------------------------------------------------ outbox

    def _committed(self, touched: set[str]) -> None:
        self.notifier.notify(touched)
        if "outbox" in touched:
            self._kick()

    def _kick(self) -> None:
        if not self._started:
            return
        if self._drain_task is None or self._drain_task.done():
            self._drain_task = asyncio.get_running_loop().create_task(self._drain(), name="outbox")
        else:
            self._drain_again = True

    def _outbox(self) -> list[OutboxRow]:
        with self.store.transaction() as tx:
            return tx.outbox(200)

    async def _drain(self) -> None:
        while True:
            self._drain_again = False
            rows = self._outbox()
            for row in rows:
                handler = self.handlers.get(row.kind)
                try:
                    if handler is None:
                        log.warning("no handler for outbox row %s; dropping it", row.kind)
                    else:
                        result = handler(row)
                        if asyncio.iscoroutine(result):
                            await result
                except Exception:
                    log.exception("outbox row %s %s failed; dropping it", row.kind, row.payload)
            if rows:
                # One transaction for the batch: a crash before it re-runs the handlers,
                # which are idempotent.
                with self.store.transaction() as tx:
                    for row in rows:
                        tx.remove_outbox(row.id)
            elif not self._drain_again:
                return

    # ------------------------------------------------------------------ runs

    def _execute(self, row: OutboxRow) -> None:
        run_id = row.payload["runId"]
        if run_id not in self._turns:
            self._turns[run_id] = asyncio.get_running_loop().create_task(
                self._turn(run_id), name=f"turn {run_id}"
            )

    async def _turn(self, run_id: str) -> None:
        from tether.providers.base import Turn  # the provider layer sits above the engine

        try:
            with self.store.transaction() as tx:
                run = tx.get(Run, run_id)
                thread = tx.get(Thread, run.thread_id) if run else None
                if run is None or thread is None or run.status != RunStatus.RUNNING:
                    return
                ids = run.trigger.get("messageIds", [])
                inputs = [m for m in tx.find(Message, run_id=run.id) if m.id in ids]
                first = tx.find(Message, limit=1, thread_id=thread.id)
            if not self.commands.begin_turn(run_id):
                return
            provider = self.providers[thread.provider]
            turn = Turn(self, thread, run, inputs, first[0] if first else None)
            status, reply, error = RunStatus.COMPLETED, None, None
            try:
                reply = await provider.run_turn(turn)
            except asyncio.CancelledError:
                if self._started:
                    return  # stopped by a cancel or an interrupt: that command ended the run
                raise
            except Conflict as conflict:
                if conflict.code == "run_ended":
                    return
                status, error = RunStatus.FAILED, conflict.message
            except Exception as exc:  # a provider's failure fails its run, never the server
                log.info("run %s failed: %s", run_id, exc)
                status, error = RunStatus.FAILED, str(exc) or type(exc).__name__
            self.commands.end_run(run_id, status, reply if status == RunStatus.COMPLETED else None, error)
        finally:
            self._turns.pop(run_id, None)

    def _stop_run(self, row: OutboxRow) -> None:
        task = self._turns.get(row.payload["runId"])
        if task is not None:
            task.cancel()

    # ------------------------------------------------------------------ processes

    def _spawn(self, row: OutboxRow) -> None:
        with self.store.transaction() as tx:
            item = tx.get(Item, row.payload["itemId"])
        if item is None or not item.is_running or item.pid is not None:
            return
        if self.processes.spawned_before(item.id):
            return  # spawned before a crash; recovery already adopted or reported it
        pid, started = self.processes.spawn(item)
        if self.commands.process_spawned(item.id, pid, started):
            item.pid = pid
            self.processes.watch(item, pid)
        else:
            self.processes.kill(item.id, pid, "cancelled")

    def _kill(self, row: OutboxRow) -> None:
        with self.store.transaction() as tx:
            item = tx.get(Item, row.payload["itemId"])
        if item is not None:
            self.processes.kill(item.id, item.pid, "cancelled")

    def _lines(self, item_id: str, lines: list[str], offset: int) -> None:
        self.commands.monitor_output(item_id, lines, offset)

    def _exited(
        self, item_id: str, code: int | None, lines: list[str], offset: int, reason: str | None, tail: str
    ) -> None:
        self.commands.process_ended(item_id, code, lines, offset, reason, tail)

    # ------------------------------------------------------------------ retention (G7)

    async def _prune(self) -> None:
        """Drop events past the retention period, hourly. Until then a peer that was away
        can resume its feed from any cursor it acknowledged."""
        while True:
            self.store.prune_events(format_time(datetime.now(UTC) - self._retention))
            await asyncio.sleep(3600)

    # ------------------------------------------------------------------ timers

    def _arm(self, row: OutboxRow) -> None:
        self._timer_wakeup.set()

    async def _timers(self) -> None:
        """Fire scheduled wakes when due — also those that fell due while we were down."""
        while True:
            self._timer_wakeup.clear()
            with self.store.transaction() as tx:
                schedules = tx.find(Item, status=ItemStatus.RUNNING, kind=ItemKind.SCHEDULE)
            now = datetime.now(UTC)
            wait: float | None = None
            for item in sorted(schedules, key=lambda i: i.due_at or ""):
                due = parse_time(item.due_at or format_time(now))
                if due <= now + timedelta(milliseconds=1):
                    self.commands.schedule_due(item.id)
                else:
                    wait = (due - now).total_seconds()
                    break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._timer_wakeup.wait(), wait)
