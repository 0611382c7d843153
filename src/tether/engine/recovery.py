"""Recovery (G6): after a restart, or when a process serving a shared store is gone for
good (SPEC §12) — and the side effects that could not be carried out.

Nothing here is special: runs end ``interrupted``, items end as their files say (or as
lost), and each thread gets one ``restart`` run, through the same kernel as any command.
"""

from __future__ import annotations

from tether.domain import tasks
from tether.domain.records import Item, Run, Task, Thread
from tether.domain.types import ItemStatus, RunStatus, Trigger
from tether.engine.background import item_ended
from tether.engine.kernel import end_run, wake
from tether.engine.unit import Unit
from tether.engine.units import Units
from tether.engine.writes import message, queue
from tether.store.base import OutboxRow


class Recovery:
    """The commands that recover work and report the side effects carried out."""

    def __init__(self, units: Units) -> None:
        self.units = units

    def effects_done(self, done: list[int], failed: list[tuple[OutboxRow, str, float | None]]) -> None:
        """Outbox rows were carried out (``done``: removed) or failed (kept, with their
        error, to retry at the given time — or parked when that time is None). A parked row
        stays visible to people and the API; what it was for fails visibly, so nothing
        waits on it forever (a turn that could not start fails its run, a process that could
        not be spawned ends its item as failed, which wakes the thread)."""
        with self.units.unit() as u:
            u.touched.add("effects")
            for row_id in done:
                u.tx.remove_outbox(row_id)
            for row, error, retry_at in failed:
                u.tx.fail_outbox(row.id, error, retry_at)
                if retry_at is None:
                    _parked(u, row, error)

    def effects_done_soon(self, done: list[int]) -> None:
        """Outbox rows were carried out: remove them with the next command instead of in a
        transaction of their own (``Units.later``). Until then they are still stored, and
        a crash re-runs them, which their handlers allow (they are idempotent); the drain
        that carried them out skips them meanwhile."""

        def write(u: Unit) -> None:
            u.touched.add("effects")
            for row_id in done:
                u.tx.remove_outbox(row_id)

        self.units.later(write)

    def recover(self, exited: dict[str, int | None], lost: list[str], member: str | None = None) -> list[str]:
        """Start-up, one transaction: running runs → interrupted, one ``restart`` run per
        thread; processes that ended while we were down are reported as usual
        (``exited``: their recorded exit codes), vanished ones by the ``restart`` run;
        a wait-mode call that died hands its result to a completion wake instead.

        With ``member``, only that process's runs: on a store several processes serve,
        a process recovers its own at start, and the survivors recover one gone for good
        (SPEC §12). Recovering twice changes nothing the second time."""
        with self.units.unit() as u:
            restarted: list[str] = []
            for run in u.query(Run, status=RunStatus.RUNNING):
                if member is None or run.member == member:
                    restarted.append(_restart(u, run))
            for item_id, code in exited.items():
                item = u.need(Item, item_id, "background item")
                if item.is_running:
                    item_ended(u, item, ItemStatus.ENDED, code, None)
            for item_id in lost:
                item = u.need(Item, item_id, "background item")
                if item.is_running:
                    reason = "lost: its process was gone after a restart"
                    item_ended(u, item, ItemStatus.FAILED, None, reason, trigger=Trigger.RESTART)
            return restarted


def _restart(u: Unit, run: Run) -> str:
    """``run`` was running when its process went away: it ends interrupted, its thread
    gets a ``restart`` run, and wait-mode calls of its thread hand their results on."""
    end_run(u, run, RunStatus.INTERRUPTED, run.reply, "tether restarted during this run")
    thread = u.need(Thread, run.thread_id, "thread")
    text = f"tether restarted while run {run.id} was active; that run was interrupted."
    notice = message(u, thread, "notification", text, {"kind": Trigger.RESTART})
    queue(u, thread, Trigger.RESTART, [notice])
    for task in u.query(Task, parent_thread_id=thread.id):
        _release_waiting_call(u, task)
    return thread.id


def _release_waiting_call(u: Unit, task: Task) -> None:
    if not task.waiting_call:
        return
    task.waiting_call = False
    if tasks.release_claim(task):
        parent = u.load(Thread, task.parent_thread_id)
        if parent is not None:
            wake(u, parent, task)
            return
    u.save(task)


def _parked(u: Unit, row: OutboxRow, error: str) -> None:
    """A parked row fails what waited on it, visibly."""
    view = {"id": row.id, "kind": row.kind, "attempts": row.attempts + 1, "lastError": error}
    u.emit("effect.parked", view, thread_id=row.thread_id)
    if row.kind == "run.execute":
        run = u.load(Run, row.payload["runId"])
        if run is not None and run.status == RunStatus.RUNNING:
            end_run(u, run, RunStatus.FAILED, None, f"could not start the turn: {error}")
    elif row.kind == "process.start":
        item = u.load(Item, row.payload["itemId"])
        if item is not None and item.is_running:
            item_ended(u, item, ItemStatus.FAILED, None, f"could not start: {error}")
