"""Background work: commands, monitors and scheduled wakes of a thread (SPEC §4).

An item's end and the wake run it queues are one transaction (G2). The runtime spawns,
tails and kills the processes after commit and reports back through these commands.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from tether.domain import background, runs
from tether.domain.records import Item, Run, Task, Thread
from tether.domain.types import DomainError, ItemKind, ItemStatus, RunStatus, Trigger
from tether.domain.views import item_view, run_view
from tether.engine import access
from tether.engine.kernel import cancel
from tether.engine.unit import Unit
from tether.engine.units import Units
from tether.engine.writes import message, on, queue, start_item
from tether.errors import Invalid, NotFound
from tether.ids import format_time, new_id, parse_time
from tether.types import Caller


class Background:
    """The commands of background items."""

    def __init__(self, units: Units) -> None:
        self.units = units

    def start_process(
        self,
        caller: Caller,
        kind: str,
        command: str,
        *,
        label: str | None = None,
        awaited: bool = False,
        persistent: bool = False,
        timeout_ms: int | None = None,
        spawn: bool = True,
    ) -> dict[str, Any]:
        """A background command or a monitor; the runtime spawns it after commit.

        With ``spawn=False`` the item is work an agent runs itself (Claude Code's background
        Bash or Monitor): tether spawns nothing, but the item counts for settled like any
        other, and the provider reports lines and the end through ``monitor_output`` and
        ``process_ended`` — the end and its wake run in one transaction, as always (G2).
        """
        if not command.strip():
            raise Invalid("command must not be empty")
        with self.units.unit() as u:
            thread = access.acting_thread(u, caller)
            item = Item(
                id=new_id("bg"),
                thread_id=thread.id,
                kind=kind,
                started_at=u.at,
                label=label,
                command=command,
                awaited=awaited,
                persistent=persistent,
                timeout_ms=timeout_ms,
                runner=None if spawn else thread.provider,
                # where its run's turn runs (SPEC §12): beside the agent's files, and if that
                # process is gone for good, the item is reported gone with its run
                member=getattr(u.load(Run, caller.run_id), "member", None),
            )
            start_item(u, item, "process.start" if spawn else None)
            return item_view(item)

    def process_spawned(
        self, item_id: str, pid: int, pid_start: str | None, member: str | None = None
    ) -> bool:
        """Record the pid (and the process ``member`` that spawned it). False when the item
        ended meanwhile: kill it. Alone on its store the write is deferred (``claim``; the
        pid file the spawn wrote already tells a restart that it ran) and an item that ended
        meanwhile gets its process killed by an outbox row."""
        shared = self.units.store.shared

        def write(u: Unit) -> bool:
            item = u.load(Item, item_id)
            if item is None:
                return False
            item.pid, item.pid_start, item.member = pid, pid_start, member
            u.save(item)
            if not item.is_running and not shared:
                u.outbox("process.kill", {"itemId": item.id}, item.thread_id)
            return item.is_running

        return self.units.claim(write)

    def process_ended(
        self,
        item_id: str,
        exit_code: int | None,
        lines: list[str] | None = None,
        offset: int | None = None,
        reason: str | None = None,
        tail: str | None = None,
    ) -> None:
        """A command or monitor ended. Its end and its wake run: one transaction (G2)."""
        with self.units.unit() as u:
            item = u.need(Item, item_id, "background item")
            if not item.is_running:
                return
            if lines:
                monitor_lines(u, item, lines, offset)
            item_ended(u, item, background.end_status(reason), exit_code, reason, tail)

    def monitor_output(self, item_id: str, lines: list[str], offset: int | None) -> None:
        with self.units.unit() as u:
            item = u.need(Item, item_id, "background item")
            if item.is_running and lines:
                monitor_lines(u, item, lines, offset)

    def schedule(self, caller: Caller, in_ms: int, text: str, hold: bool = False) -> dict[str, Any]:
        if in_ms < 0:
            raise Invalid("inMs must be zero or more")
        with self.units.unit() as u:
            thread = access.acting_thread(u, caller)
            due = format_time(parse_time(u.at) + timedelta(milliseconds=in_ms))
            item = Item(
                id=new_id("bg"),
                thread_id=thread.id,
                kind=ItemKind.SCHEDULE,
                started_at=u.at,
                hold=hold,
                due_at=due,
                text=text,
            )
            return item_view(start_item(u, item, "timer.arm"))

    def schedule_due(self, item_id: str) -> None:
        with self.units.unit() as u:
            item = u.need(Item, item_id, "background item")
            if item.is_running:
                item_ended(u, item, ItemStatus.ENDED, None, None)

    def background_wait(self, caller: Caller, ref: str) -> dict[str, Any]:
        """Mark a background command awaited: the thread holds until it ends."""
        with self.units.unit() as u:
            thread = access.acting_thread(u, caller)
            item = find_item(u, thread, ref)
            try:
                background.await_(item)
            except DomainError as error:
                raise Invalid(str(error)) from None
            u.save(item)
            u.emit("item.updated", item_view(item), thread_id=thread.id)
            u.mark(thread.id)
            return item_view(item)

    def stop_item(self, caller: Caller, item_id: str, reason: str = "stopped by a person") -> dict[str, Any]:
        """Stop one background item (the web page's per-item stop). A command or monitor
        ends ``cancelled`` and its thread is woken as for any end (it must learn that its
        work is gone); a schedule is dropped; a task is cancelled (``task_cancel``)."""
        with self.units.unit() as u:
            item = u.need(Item, item_id, "background item")
            thread = access.thread_for(u, caller, item.thread_id)
            stopped = item.is_running
            if item.is_running and item.kind == ItemKind.TASK:
                task = u.load(Task, item.task_id)
                if task is not None and task.is_open:
                    cancel(u, task, False, reason)
            elif item.is_running and item.kind == ItemKind.SCHEDULE:
                background.end(item, ItemStatus.CANCELLED, u.at, reason=reason)
                u.save(item)
                u.emit("item.ended", item_view(item), thread_id=thread.id)
                u.mark(thread.id)
            elif item.is_running:
                item_ended(u, item, ItemStatus.CANCELLED, None, reason)
                u.outbox("process.kill", {"itemId": item.id, **on(item.member)}, item.thread_id)
            return {
                "itemId": item.id,
                "threadId": thread.id,
                "kind": item.kind,
                "status": item.status,
                "stopped": stopped,
            }


def find_item(u: Unit, thread: Thread, ref: str) -> Item:
    """A thread's item by id, or by the label it was started with."""
    item = u.load(Item, ref)
    if item is not None and item.thread_id == thread.id:
        return item
    for item in u.query(Item, thread_id=thread.id):
        if item.label == ref:
            return item
    raise NotFound(f"no background item {ref!r} in thread {thread.id}")


def item_ended(
    u: Unit,
    item: Item,
    status: str,
    exit_code: int | None,
    reason: str | None,
    tail: str | None = None,
    trigger: str | None = None,
) -> None:
    """End ``item`` and queue its thread's wake run with the notice of how it ended."""
    background.end(item, status, u.at, exit_code, reason)
    u.save(item)
    u.emit("item.ended", item_view(item), thread_id=item.thread_id)
    thread = u.need(Thread, item.thread_id, "thread")
    text = background.end_text(item) + (f"\n{tail}" if tail else "")
    kind = trigger or background.WAKE_TRIGGER[ItemKind(item.kind)]
    source = {"kind": kind, "itemId": item.id, "label": item.label, "exitCode": exit_code}
    notice = message(u, thread, "notification", text, source)
    if kind == Trigger.MONITOR_FINISHED:
        _fold_monitor_events(u, thread, item)
    queue(u, thread, kind, [notice], key=item.id if kind != Trigger.RESTART else None)


def _fold_monitor_events(u: Unit, thread: Thread, item: Item) -> None:
    """Lines not yet handled when their monitor ends join its ``monitor_finished`` run."""
    for run in u.query(Run, thread_id=thread.id, status=RunStatus.QUEUED):
        if runs.folds_into(run, Trigger.MONITOR_EVENT, item.id):
            run.trigger = {**run.trigger, "kind": str(Trigger.MONITOR_FINISHED)}
            u.save(run)
            u.emit("run.folded", run_view(run), thread_id=thread.id, run_id=run.id)


def monitor_lines(u: Unit, item: Item, lines: list[str], offset: int | None) -> None:
    """New output of a monitor: its event, and a ``monitor_event`` run (progress, G4)."""
    if offset is not None:
        item.offset = offset
    item.last_line = lines[-1]
    u.save(item)
    u.emit("item.output", {**item_view(item), "lines": lines}, thread_id=item.thread_id)
    thread = u.need(Thread, item.thread_id, "thread")
    source = {"kind": Trigger.MONITOR_EVENT, "itemId": item.id, "label": item.label}
    notice = message(u, thread, "notification", "\n".join(lines), source)
    queue(u, thread, Trigger.MONITOR_EVENT, [notice], key=item.id)
