"""Timers: scheduled wakes and task deadlines, fired when they fall due (SPEC §6, §11).

Armed timers are kept in memory, soonest first, as ``(dueAt, itemId, kind)``. They are
seeded from the store at start, so what fell due while the process was down fires at
once, and fed by ``timer.arm`` outbox rows after that. Each timer fires through its
command, which re-reads the item and does nothing if its moment has passed: a timer fired
twice (after a reseed, or by another process on a shared store) is harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
from datetime import UTC, datetime

from tether.domain.records import Item
from tether.domain.types import ItemKind, ItemStatus
from tether.engine.commands import Commands
from tether.ids import format_time, parse_time
from tether.store.base import OutboxRow, Store

log = logging.getLogger(__name__)


class Timers:
    def __init__(self, store: Store, commands: Commands) -> None:
        self.store = store
        self.commands = commands
        self._due: list[tuple[str, str, str]] = []
        self._wakeup = asyncio.Event()

    def arm(self, row: OutboxRow) -> None:
        """The ``timer.arm`` outbox handler: the row's item gets its timer."""
        with self.store.read() as reader:
            item = reader.get(Item, row.payload["itemId"])
        if item is not None and item.due_at is not None:
            heapq.heappush(self._due, (item.due_at, item.id, item.kind))
            self._wakeup.set()

    def seed(self) -> None:
        """Every timer the store holds, from scratch."""
        with self.store.read() as reader:
            items = reader.find(Item, status=ItemStatus.RUNNING, kind=[ItemKind.SCHEDULE, ItemKind.TASK])
        self._due = [(i.due_at, i.id, i.kind) for i in items if i.due_at is not None]
        heapq.heapify(self._due)

    def wake(self) -> None:
        """Look at the soonest timer again (after ``seed``)."""
        self._wakeup.set()

    async def run(self) -> None:
        """Fire each timer when due, through its command; sleep until the next one."""
        fire = {ItemKind.SCHEDULE: self.commands.schedule_due, ItemKind.TASK: self.commands.deadline_due}
        while True:
            self._wakeup.clear()
            horizon = format_time(datetime.now(UTC))  # never early: a deadline means "after"
            while self._due and self._due[0][0] <= horizon:
                _, item_id, kind = heapq.heappop(self._due)
                try:
                    fire[ItemKind(kind)](item_id)
                except Exception:  # one bad timer must not stop the others
                    log.exception("timer of %s failed", item_id)
            wait = (parse_time(self._due[0][0]) - datetime.now(UTC)).total_seconds() if self._due else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), wait)
