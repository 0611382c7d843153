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

**Several processes on one store** (``Store.shared``, PostgreSQL: SPEC §12). Each process
is a *member*, named by ``DATA/member.id`` (so a restarted process is the same member).
It claims outbox rows with a lease instead of reading them; a turn it begins and a
process it spawns carry its name, so only it stops or kills them (rows for it name it).
It beats every ``lease / 3`` seconds; a member whose lease ran out is gone for good and
the first survivor to notice recovers it as a restart would (``Commands.recover``). The
store's doorbell wakes it when others commit: it reads the events it has not seen and
wakes its own waiters, and it re-reads timers and the outbox every ``POLL`` seconds, so a
missed notification only delays.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tether.domain.records import Item, Message, Run, Thread
from tether.domain.types import ItemKind, ItemStatus, RunStatus
from tether.engine.commands import Commands
from tether.engine.notify import Notifier
from tether.engine.port import Services, Turn
from tether.engine.processes import ProcessManager, choose_backend
from tether.engine.timers import Timers
from tether.errors import Conflict
from tether.ids import format_time, new_id
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
#: Shared stores: how long a member's claims and heartbeat last (``TETHER_LEASE_SECONDS``) …
LEASE = 15.0
#: … and how often it looks at the store without a notification (events, outbox, timers;
#: ``TETHER_POLL_SECONDS``).
POLL = 1.0
#: How many outbox rows a process claims at a time (the rest stay for the others).
CLAIM_BATCH = 20
#: How many outbox rows a process alone on its store reads at a time.
_BATCH = 200


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
        #: This process's name among those serving the store (stable across restarts).
        self.member = _member_id(data_dir)
        self.lease = float(os.environ.get("TETHER_LEASE_SECONDS", LEASE))
        self.poll = float(os.environ.get("TETHER_POLL_SECONDS", POLL))
        self.notifier = Notifier()
        self.commands = Commands(store, environment_id, providers, self._committed)
        self.workspace = data_dir / "workspace"
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.processes = ProcessManager(
            data_dir / "proc", self.workspace, self._lines, self._exited, choose_backend()
        )
        self.timers = Timers(store, self.commands)
        self.handlers: dict[str, OutboxHandler] = {
            "run.execute": self._execute,
            "run.stop": self._stop_run,
            "process.start": self._spawn,
            "process.kill": self._kill,
            "timer.arm": self.timers.arm,
        }
        self._turns: dict[str, asyncio.Task[None]] = {}
        self._drain_task: asyncio.Task[None] | None = None
        self._drain_again = False
        #: Rows carried out whose removal waits for the next command (``effects_done_soon``).
        self._carried: set[int] = set()
        self._retry: asyncio.TimerHandle | None = None
        self._timer_task: asyncio.Task[None] | None = None
        self._started = False
        self._retention = timedelta(days=retention_days)
        self._housekeeping: asyncio.Task[None] | None = None
        self._shared_loops: list[asyncio.Task[None]] = []
        #: The last event this process has woken its waiters for (shared stores).
        self._seen = 0
        #: What turns are lent (``start`` takes them from the environment that assembles
        #: them: the tools are built over these commands, so they cannot come first).
        self._services: Services | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self, services: Services) -> None:
        """Recover (G6), then start carrying out the outbox and the timers; every turn is
        lent ``services``."""
        self._services = services
        if self.store.shared:
            self._beat()  # alive before any turn here carries this process's name
        exited: dict[str, int | None] = {}
        lost: list[str] = []
        adopt: list[tuple[Item, int]] = []
        with self.store.read() as reader:
            pending = reader.outbox(limit=1_000_000)
            items = reader.find(
                Item, status=ItemStatus.RUNNING, kind=[ItemKind.COMMAND, ItemKind.MONITOR, ItemKind.AGENT]
            )
        pending_spawns = {row.payload["itemId"] for row in pending if row.kind == "process.start"}
        items = [i for i in items if self._mine(i)]
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
        self.commands.recover(exited, lost, self.member if self.store.shared else None)
        self.timers.seed()
        self._seen = self.store.last_event_seq()
        self._started = True
        for item, pid in adopt:
            self.processes.watch(item, pid)
        for adopter, its in agent_run:
            adopter(services, its)
        self._timer_task = asyncio.create_task(_supervise("timers", self.timers.run), name="timers")
        self._housekeeping = asyncio.create_task(_supervise("prune events", self._prune), name="prune")
        if self.store.shared:
            self._shared_loops = [
                asyncio.create_task(_supervise("heartbeat", self._heartbeat), name="heartbeat"),
                asyncio.create_task(_supervise("doorbell", self._doorbell), name="doorbell"),
            ]
        self._kick()
        if self._drain_task is not None:
            await asyncio.shield(self._drain_task)

    def _mine(self, item: Item) -> bool:
        """Whether recovery at start is this process's to do for ``item``: on a shared store
        only what it ran (or spawned, by its own files, before it could say so); alone,
        everything."""
        if not self.store.shared or item.member == self.member:
            return True
        return item.member is None and item.runner is None and self.processes.spawned_before(item.id)

    def _agent_run(
        self, items: list[Item], lost: list[str]
    ) -> list[tuple[Callable[[Services, list[Item]], None], list[Item]]]:
        """Background work an agent runs itself (``spawn=False``) has no process of tether's
        to look at: its provider adopts it (``provider.adopt(services, items)``: it reports each
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
        own = (
            self._timer_task, self._housekeeping, self._drain_task, *self._shared_loops, *self._turns.values()
        )
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
            rows = self._due_rows()
            done: list[int] = []
            failed: list[tuple[OutboxRow, str, float | None]] = []
            for row in rows:
                await asyncio.sleep(0)  # let the loop breathe (heartbeats, requests) between rows
                error = await self._carry_out(row)
                if error is None:
                    done.append(row.id)
                else:
                    failed.append((row, error, retry_at(row.attempts + 1, time.time())))
            if rows:
                # One transaction for the batch: a crash before it re-runs the handlers,
                # which are idempotent. Alone on the store with nothing failed, the rows
                # go with the next command (and are skipped here until then).
                if failed or self.store.shared:
                    self.commands.effects_done(done, failed)
                else:
                    self.commands.effects_done_soon(done)
                    self._carried.update(done)
            elif not self._drain_again:
                with self.store.read() as reader:
                    when = reader.next_retry()
                if when is not None:
                    self._kick_at(when)
                return

    def _due_rows(self) -> list[OutboxRow]:
        """The rows to carry out now: on a shared store, claimed for this process."""
        if self.store.shared:
            with self.store.transaction() as tx:  # a small batch: what is claimed is done soon
                return tx.claim_outbox(self.member, time.time(), self.lease, CLAIM_BATCH)
        with self.store.read() as reader:
            rows = reader.outbox(_BATCH, due=time.time())
        if len(rows) < _BATCH:  # every stored row was read: the others were removed
            self._carried &= {row.id for row in rows}
        return [row for row in rows if row.id not in self._carried]

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
        """Begin the turn here (the run names this process) before the row is removed: a
        crash in between leaves the run to this process's recovery, never to nobody."""
        run_id = row.payload["runId"]
        if run_id not in self._turns and self.commands.begin_turn(run_id, self.member):
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
        if self._services is None:
            raise RuntimeError("the runtime runs turns only once started")
        with self.store.read() as reader:
            run = reader.get(Run, run_id)
            thread = reader.get(Thread, run.thread_id) if run else None
            if run is None or thread is None or run.status != RunStatus.RUNNING:
                return
            ids = run.trigger.get("messageIds", [])
            inputs = [m for m in reader.find(Message, run_id=run.id) if m.id in ids]
            first = reader.find(Message, limit=1, thread_id=thread.id)
        provider = self.providers[thread.provider]
        turn = Turn(self._services, thread, run, inputs, first[0] if first else None)
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
        if item is None or not item.is_running or item.pid is not None or not self._here(item):
            return
        if self.processes.spawned_before(item.id):
            return  # spawned before a crash; recovery already adopted or reported it
        pid, started = self.processes.spawn(item)
        if self.commands.process_spawned(item.id, pid, started, self.member):
            item.pid, item.pid_start = pid, started  # the watcher need not look it up again
            self.processes.watch(item, pid)
        else:
            self.processes.kill(item.id, pid, "cancelled")

    def _kill(self, row: OutboxRow) -> None:
        with self.store.read() as reader:
            item = reader.get(Item, row.payload["itemId"])
        if item is not None and self._here(item):
            self.processes.kill(item.id, item.pid, "cancelled")

    def _here(self, item: Item) -> bool:
        """Whether ``item``'s process is (to be) this process's: never spawn or kill for
        another process (its pid means nothing on this machine)."""
        return item.member in (None, self.member)

    def _lines(self, item_id: str, lines: list[str], offset: int) -> None:
        self.commands.monitor_output(item_id, lines, offset)

    def _exited(
        self, item_id: str, code: int | None, lines: list[str], offset: int, reason: str | None, tail: str
    ) -> None:
        self.commands.process_ended(item_id, code, lines, offset, reason, tail)

    # ------------------------------------------------------------------ retention (G7)

    async def _prune(self) -> None:
        """Drop events past the retention period, hourly: until then a peer that was away
        can resume its feed from any cursor it acknowledged. Background commands' files go
        after as long (``prune_files``)."""
        while True:
            cutoff = datetime.now(UTC) - self._retention
            self.store.prune_events(format_time(cutoff))
            self.prune_files(cutoff.timestamp())
            await asyncio.sleep(3600)

    def prune_files(self, before: float) -> int:
        """Remove the files of ended background commands last written before ``before``.
        The running items are read first and nothing awaits in between, so a command that
        still runs, or one whose end is not yet recorded (it is running in the store until
        then, also across a restart), keeps its files."""
        with self.commands.snapshot() as view:
            running = {key for key, _ in view.reader.find_rows(Item, status=ItemStatus.RUNNING)}
        removed = self.processes.prune(before, keep=running)
        if removed:
            log.info("removed the files of %d ended background commands", removed)
        return removed

    # ------------------------------------------------------------------ several processes

    async def _heartbeat(self) -> None:
        """Say this process is alive; recover every member whose lease ran out."""
        while True:
            self._beat()
            await asyncio.sleep(self.lease / 3)

    def _beat(self) -> None:
        with self.store.transaction() as tx:
            gone = tx.beat(self.member, time.time(), self.lease)
        for member in gone:
            self.take_over(member)

    def take_over(self, member: str) -> None:
        """``member`` is gone for good: its runs are interrupted, its commands, monitors and
        agent-run work reported gone, one ``restart`` run per thread — as after a restart
        (G6). Then it is forgotten, with the rows only it could carry out."""
        with self.store.read() as reader:
            items = reader.find(
                Item, status=ItemStatus.RUNNING, kind=[ItemKind.COMMAND, ItemKind.MONITOR, ItemKind.AGENT]
            )
        lost = [item.id for item in items if item.member == member]
        log.warning("tether process %s is gone: recovering its runs and %d items", member, len(lost))
        self.commands.recover({}, lost, member)
        with self.store.transaction() as tx:
            tx.forget_member(member)

    async def _doorbell(self) -> None:
        """Wake this process's waiters for what other processes committed; look at the
        outbox and the timers again (new rows, leases that ran out, deadlines)."""
        polled = time.monotonic()
        async for rung in self.store.rings(self.poll):
            if "events" in rung:
                self._caught_up()
            if "outbox" in rung:
                self._kick()
            if time.monotonic() - polled >= self.poll:
                self._caught_up()
                polled = time.monotonic()
                self._kick()
                self.timers.seed()
                self.timers.wake()

    def _caught_up(self) -> None:
        """Notify the keys of every event after ``_seen``."""
        keys: set[str] = set()
        while events := self.store.events_after(self._seen, 1000):
            for event in events:
                if event.thread_id:
                    keys.add(f"thread:{event.thread_id}")
                if event.task_id:
                    keys.add(f"task:{event.task_id}")
            self._seen = events[-1].seq
            keys.add("events")
        self.notifier.notify(keys)


def _member_id(data_dir: Path) -> str:
    """This process's member name, kept in ``DATA/member.id``: the same after a restart, so
    a process that comes back recovers its own work (its files are in DATA)."""
    path = data_dir / "member.id"
    if not path.exists():
        path.write_text(new_id("mbr") + "\n")
    return path.read_text().strip()


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
