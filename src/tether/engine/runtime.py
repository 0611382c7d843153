"""The runtime: carries out the outbox after each commit, and recovers on start.

Outbox rows are side effects a command decided on: start a provider turn, spawn or kill a
process, arm a timer, call a peer. A row is removed only after its handler ran, and every
handler is idempotent (it re-reads the record and does nothing if the moment has passed),
so a crash between commit and side effect just means the row is handled on the next start.

A handler that fails keeps its row: it is tried again with backoff (``RETRY_FIRST`` s,
doubling, at most ``RETRY_MAX`` s apart) and after ``PARK_AFTER`` attempts it is parked —
kept, shown on its thread and by ``GET /api/outbox``, and what waited on it is failed
visibly (``Commands.effects_done``). Nothing is dropped.

Every task this runtime starts is supervised: the long-lived loops (outbox, timers,
retention) log an exception and start again; a turn whose bookkeeping fails is failed,
never left ``running``.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tether.domain.records import Item, Message, Run, Thread
from tether.domain.types import ItemKind, ItemStatus, RunStatus
from tether.engine.commands import Commands
from tether.engine.notify import Notifier
from tether.engine.processes import ProcessManager, choose_backend
from tether.errors import Conflict
from tether.ids import format_time, parse_time
from tether.store.base import OutboxRow, Store

log = logging.getLogger(__name__)

OutboxHandler = Callable[[OutboxRow], Awaitable[None] | None]

#: A failed side effect is tried again after this many seconds, doubling each time …
RETRY_FIRST = 0.1
#: … at most this far apart …
RETRY_MAX = 30.0
#: … and parked (kept and shown, never deleted) after this many attempts.
PARK_AFTER = 8
#: A supervised loop that crashed starts again after this many seconds.
RESTART_DELAY = 1.0


def retry_at(attempts: int, now: float) -> float | None:
    """When a row that has now failed ``attempts`` times is tried again; None: park it."""
    if attempts >= PARK_AFTER:
        return None
    return now + min(RETRY_MAX, RETRY_FIRST * 2 ** (attempts - 1))


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
        self.processes = ProcessManager(
            data_dir / "proc", self.workspace, self._lines, self._exited, choose_backend()
        )
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
        self._retry: asyncio.TimerHandle | None = None
        self._timer_wakeup = asyncio.Event()
        #: Armed timers ``(dueAt, itemId, kind)``, soonest first: scheduled wakes and task
        #: deadlines. Seeded from the store at start, fed by ``timer.arm`` rows after.
        self._due: list[tuple[str, str, str]] = []
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
        with self.store.read() as reader:
            pending = reader.outbox(limit=1_000_000)
            items = reader.find(
                Item, status=ItemStatus.RUNNING, kind=[ItemKind.COMMAND, ItemKind.MONITOR, ItemKind.AGENT]
            )
        pending_spawns = {row.payload["itemId"] for row in pending if row.kind == "process.start"}
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
        self._seed_timers()
        self._started = True
        for item, pid in adopt:
            self.processes.watch(item, pid)
        for adopter, its in agent_run:
            adopter(self, its)
        self._timer_task = asyncio.create_task(_supervise("timers", self._timers), name="timers")
        self._housekeeping = asyncio.create_task(_supervise("prune events", self._prune), name="prune")
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
        if self._retry is not None:
            self._retry.cancel()
        self.commands.flush()  # what running turns said and kept is not lost on a clean stop
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
            self._drain_task.add_done_callback(self._drained)
        else:
            self._drain_again = True

    def _drained(self, task: asyncio.Task[None]) -> None:
        """Supervise the drain: a crash is logged and the drain starts again shortly."""
        if not task.cancelled() and task.exception() is not None:
            log.error("the outbox drain failed; starting it again", exc_info=task.exception())
            self._kick_at(time.time() + RESTART_DELAY)

    def _kick_at(self, when: float) -> None:
        """Drain again at ``when`` (epoch seconds): the earliest failed row falls due."""
        if self._retry is not None:
            self._retry.cancel()
        self._retry = asyncio.get_running_loop().call_later(max(0.0, when - time.time()), self._kick)

    async def _drain(self) -> None:
        while True:
            self._drain_again = False
            with self.store.read() as reader:
                rows = reader.outbox(200, due=time.time())
            done: list[int] = []
            failed: list[tuple[OutboxRow, str, float | None]] = []
            for row in rows:
                error = await self._carry_out(row)
                if error is None:
                    done.append(row.id)
                else:
                    failed.append((row, error, retry_at(row.attempts + 1, time.time())))
            if rows:
                # One transaction for the batch: a crash before it re-runs the handlers,
                # which are idempotent.
                self.commands.effects_done(done, failed)
            elif not self._drain_again:
                with self.store.read() as reader:
                    when = reader.next_retry()
                if when is not None:
                    self._kick_at(when)
                return

    async def _carry_out(self, row: OutboxRow) -> str | None:
        """Run ``row``'s handler; None when it succeeded, else what went wrong."""
        handler = self.handlers.get(row.kind)
        if handler is None:
            return f"no handler for {row.kind}"
        try:
            result = handler(row)
            if asyncio.iscoroutine(result):
                await result
        except Exception as exc:
            log.exception("outbox row %s %s failed (attempt %d)", row.kind, row.payload, row.attempts + 1)
            return f"{type(exc).__name__}: {exc}"
        return None

    # ------------------------------------------------------------------ runs

    def _execute(self, row: OutboxRow) -> None:
        run_id = row.payload["runId"]
        if run_id not in self._turns:
            self._turns[run_id] = asyncio.get_running_loop().create_task(
                self._turn(run_id), name=f"turn {run_id}"
            )

    async def _turn(self, run_id: str) -> None:
        """One provider turn, supervised: whatever fails, the run ends (never left running)."""
        try:
            await self._provider_turn(run_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("run %s: the engine failed around the provider turn", run_id)
            try:
                self.commands.end_run(run_id, RunStatus.FAILED, None, f"tether failed: {exc}")
            except Exception:
                log.exception("run %s could not be failed; the next start interrupts it", run_id)
        finally:
            self._turns.pop(run_id, None)

    async def _provider_turn(self, run_id: str) -> None:
        from tether.providers.base import Turn  # the provider layer sits above the engine

        with self.store.read() as reader:
            run = reader.get(Run, run_id)
            thread = reader.get(Thread, run.thread_id) if run else None
            if run is None or thread is None or run.status != RunStatus.RUNNING:
                return
            ids = run.trigger.get("messageIds", [])
            inputs = [m for m in reader.find(Message, run_id=run.id) if m.id in ids]
            first = reader.find(Message, limit=1, thread_id=thread.id)
        self.commands.begin_turn(run_id)  # the snapshot above saw it running
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

    def _stop_run(self, row: OutboxRow) -> None:
        task = self._turns.get(row.payload["runId"])
        if task is not None:
            task.cancel()

    # ------------------------------------------------------------------ processes

    def _spawn(self, row: OutboxRow) -> None:
        with self.store.read() as reader:
            item = reader.get(Item, row.payload["itemId"])
        if item is None or not item.is_running or item.pid is not None:
            return
        if self.processes.spawned_before(item.id):
            return  # spawned before a crash; recovery already adopted or reported it
        pid, started = self.processes.spawn(item)
        self.commands.process_spawned(item.id, pid, started)
        item.pid = pid
        self.processes.watch(item, pid)

    def _kill(self, row: OutboxRow) -> None:
        with self.store.read() as reader:
            item = reader.get(Item, row.payload["itemId"])
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
        with self.store.read() as reader:
            item = reader.get(Item, row.payload["itemId"])
        if item is not None and item.due_at is not None:
            heapq.heappush(self._due, (item.due_at, item.id, item.kind))
            self._timer_wakeup.set()

    def _seed_timers(self) -> None:
        """Every timer the store holds: what fell due while we were down fires at once."""
        with self.store.read() as reader:
            items = reader.find(Item, status=ItemStatus.RUNNING, kind=[ItemKind.SCHEDULE, ItemKind.TASK])
        self._due = [(i.due_at, i.id, i.kind) for i in items if i.due_at is not None]
        heapq.heapify(self._due)

    async def _timers(self) -> None:
        """Fire scheduled wakes and task deadlines when due, each through its command, which
        re-reads the item and does nothing if its moment has passed (a repeat is harmless)."""
        fire = {ItemKind.SCHEDULE: self.commands.schedule_due, ItemKind.TASK: self.commands.deadline_due}
        while True:
            self._timer_wakeup.clear()
            horizon = format_time(datetime.now(UTC))  # never early: a deadline means "after"
            while self._due and self._due[0][0] <= horizon:
                _, item_id, kind = heapq.heappop(self._due)
                try:
                    fire[ItemKind(kind)](item_id)
                except Exception:  # one bad timer must not stop the others
                    log.exception("timer of %s failed", item_id)
            wait = (parse_time(self._due[0][0]) - datetime.now(UTC)).total_seconds() if self._due else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._timer_wakeup.wait(), wait)


async def _supervise(name: str, loop: Callable[[], Awaitable[None]]) -> None:
    """Run a long-lived loop; if it raises, log it and start it again (never die silently)."""
    while True:
        try:
            await loop()
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s failed; starting it again in %.0f s", name, RESTART_DELAY)
            await asyncio.sleep(RESTART_DELAY)
