"""Reads: the views the API, the tools and the CLI show. Always through the fence (G10)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from tether.domain import attention
from tether.domain.ledger import ledger
from tether.domain.records import Item, Message, Run, Task, Thread
from tether.domain.types import ACTIVE_RUN, ItemStatus, RunStatus
from tether.domain.views import item_view, message_view, run_view, task_view, thread_summary
from tether.engine import access
from tether.engine.commands import Commands
from tether.engine.unit import View
from tether.errors import Forbidden, Invalid, NotFound
from tether.store.base import OutboxRow
from tether.types import Caller


class Queries:
    def __init__(self, commands: Commands) -> None:
        self.commands = commands

    @property
    def environment_id(self) -> str:
        return self.commands.environment_id

    def thread(self, caller: Caller, thread_id: str) -> dict[str, Any]:
        with self.commands.view() as u:
            thread = access.thread_for(u, caller, thread_id)
            runs = u.query(Run, thread_id=thread.id)
            items = u.query(Item, thread_id=thread.id)
            delegated = u.query(Task, parent_thread_id=thread.id)
            return {
                **thread_summary(thread, self.environment_id),
                **attention.summary(thread, runs, items, delegated),
                "lastRun": last_run_view(attention.last_answer_run(runs)),
                "runs": [run_view(r) for r in runs],
                "messages": [message_view(m) for m in u.query(Message, thread_id=thread.id)],
                "background": [item_view(i) for i in items],
                "tasks": [_with_error(u, t) for t in delegated],
                "ledger": ledger(delegated, runs),
                "parkedEffects": [effect_view(row) for row in u.reader.parked(thread.id)],
            }

    def effects(self, caller: Caller) -> dict[str, Any]:
        """Side effects not yet carried out: pending ones and those parked after repeated
        failures (admin only: they span every thread)."""
        if caller.kind != "admin":
            raise Forbidden("only the admin token can read the outbox")
        with self.commands.view() as u:
            return {
                "pending": [effect_view(row) for row in u.reader.outbox(limit=1000)],
                "parked": [effect_view(row) for row in u.reader.parked()],
            }

    def threads(self, caller: Caller) -> list[dict[str, Any]]:
        with self.commands.view() as u:
            where = {"token_id": caller.token_id} if caller.kind == "link" else {}
            found = u.query(Thread, **where)
            return [
                {**thread_summary(t, self.environment_id), **attention_fields(u, t)}
                for t in found
                if access.visible(u, caller, t)
            ]

    def thread_row(self, caller: Caller, thread_id: str) -> dict[str, Any] | None:
        """One thread's summary as :meth:`threads` reads it (the same attention), with its
        running background items and its parent's title when the parent is here — the
        threads list's row, re-read when an event touches it (``None``: not visible)."""
        with self.commands.view() as u:
            thread = u.load(Thread, thread_id)
            if thread is None or not access.visible(u, caller, thread):
                return None
            summary = {**thread_summary(thread, self.environment_id), **attention_fields(u, thread)}
            running = len(u.query(Item, thread_id=thread_id, status=ItemStatus.RUNNING))
        return {**summary, "running": running, "parentTitle": self.local_title(summary)}

    def local_title(self, summary: dict[str, Any]) -> str | None:
        """The title of a thread summary's parent, when that parent lives here."""
        parent_id = summary.get("parentThreadId")
        if not parent_id or summary.get("parentEnvironmentId") != self.environment_id:
            return None
        with self.commands.view() as u:
            parent = u.load(Thread, parent_id)
        return (parent.title or "untitled") if parent is not None else None

    def overview(self) -> dict[str, Any]:
        """How many threads and running background items this environment holds, and how
        many of those items each thread runs (admin's threads list)."""
        with self.commands.view() as u:
            running = u.reader.find(Item, status=ItemStatus.RUNNING)
            return {
                "threads": u.reader.count(Thread),
                "background": len(running),
                "runningByThread": dict(Counter(item.thread_id for item in running)),
            }

    def messages(self, caller: Caller, thread_id: str, after: int = 0, limit: int = 100) -> dict[str, Any]:
        if limit < 1 or limit > 1000:
            raise Invalid("limit must be between 1 and 1000")
        with self.commands.view() as u:
            thread = access.thread_for(u, caller, thread_id)
            found = [m for m in u.query(Message, thread_id=thread.id) if m.seq > after][:limit]
            return {
                "threadId": thread.id,
                "status": thread.status,
                "settled": thread.settled,
                "messages": [message_view(m) for m in found],
                "nextPosition": found[-1].seq if found else after,
            }

    def task(self, caller: Caller, task_id: str) -> dict[str, Any]:
        with self.commands.view() as u:
            return _with_error(u, access.task_for(u, caller, task_id))

    def tasks(
        self, caller: Caller, parent_thread_id: str | None = None, status: str | None = None
    ) -> list[dict[str, Any]]:
        where: dict[str, Any] = {}
        if parent_thread_id:
            where["parent_thread_id"] = parent_thread_id
        if status:
            where["status"] = status
        with self.commands.view() as u:
            found = []
            for task in u.query(Task, **where):
                try:
                    found.append(_with_error(u, access.task_for(u, caller, task.id)))
                except NotFound:  # not visible to this caller
                    continue
            return found

    def wait_state(
        self, caller: Caller, thread_id: str, until_settled: bool, after_run_id: str | None
    ) -> dict[str, Any] | None:
        """The answer of ``thread_wait`` if its condition holds now, else None.

        The condition: the thread is idle (settled, with ``untilSettled``) and, given
        ``afterRunId``, that run and every run before it have ended.
        """
        with self.commands.view() as u:
            thread = access.thread_for(u, caller, thread_id)
            return _wait_answer(u, thread, until_settled, after_run_id)


def effect_view(row: OutboxRow) -> dict[str, Any]:
    return {
        "id": str(row.id),
        "kind": row.kind,
        "threadId": row.thread_id,
        "payload": row.payload,
        "attempts": row.attempts,
        "lastError": row.last_error,
        "parked": row.parked,
    }


def attention_fields(u: View, thread: Thread) -> dict[str, Any]:
    """``{attention, attentionSince}`` of one thread (SPEC §10), read with few queries."""
    active = u.query(Run, thread_id=thread.id, status=list(ACTIVE_RUN))
    items = u.query(Item, thread_id=thread.id, status=ItemStatus.RUNNING)
    open_tasks = [t for t in u.query(Task, parent_thread_id=thread.id) if attention.will_answer(t)]
    last = u.query(Run, thread_id=thread.id, seq=thread.run_count)
    if last and last[0].is_progress:
        last = [attention.last_answer_run(u.query(Run, thread_id=thread.id))] if thread.run_count else []
    found = last[0] if last else None
    state = attention.attention(thread, active, items, open_tasks, found)
    return {
        "attention": state,
        "attentionSince": attention.since(state, thread, active, items, found),
        "lastRun": last_run_view(found),
    }


def last_run_view(run: Run | None) -> dict[str, Any] | None:
    """How the thread's last non-progress run went, for a person: its status, error and
    trigger tell a failure (and why) from a stop by a person or a cut-off by a restart."""
    if run is None:
        return None
    return {"runId": run.id, "status": run.status, "error": run.error, "trigger": run.kind}


def _with_error(u: View, task: Task) -> dict[str, Any]:
    """A task's view; a failed task's result also says why, from its child's failed run
    (when the child is here: a linked child's task says what its environment says)."""
    view = task_view(task)
    result = view.get("result") or {}
    if result.get("status") == "failed" and not result.get("error") and result.get("runId"):
        run = u.load(Run, result["runId"])
        if run is not None and run.error:
            view["result"] = {**result, "error": run.error}
    return view


def _wait_answer(
    u: View, thread: Thread, until_settled: bool, after_run_id: str | None
) -> dict[str, Any] | None:
    if after_run_id is not None:
        after = u.load(Run, after_run_id)
        if after is None or after.thread_id != thread.id:
            raise Invalid(f"afterRunId {after_run_id!r} is not a run of thread {thread.id}")
        active = u.query(Run, thread_id=thread.id, status=list(ACTIVE_RUN))
        if any(run.seq <= after.seq for run in active):
            return None
    if until_settled and not thread.settled:
        return None
    if not until_settled and thread.status != "idle":
        return None
    ended = [
        r for r in u.query(Run, thread_id=thread.id) if r.status not in (RunStatus.QUEUED, RunStatus.RUNNING)
    ]
    return {
        "threadId": thread.id,
        "settled": thread.settled,
        "status": thread.status,
        "runId": ended[-1].id if ended else None,
        "timedOut": False,
    }
