"""A small harness over a real :class:`Commands` on a temp SQLite file.

No runtime is attached, so nobody executes runs: the test plays the provider (it ends
runs with ``end_run`` and acts during them as the thread). After every commit the
harness re-reads the whole store and records any violation of the commit-level
invariants (G2): a reader must never see a thread whose ``settled`` flag disagrees with
``threads.is_settled``, nor an ended background item whose wake run is not yet queued.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tether.domain import threads
from tether.domain.records import Item, Message, Run, Task, Thread
from tether.domain.types import ACTIVE_RUN, ItemKind, ItemStatus, RunStatus, Trigger
from tether.engine.commands import Commands
from tether.engine.queries import Queries
from tether.store.base import Store, Transaction
from tether.store.sqlite import SQLiteStore
from tether.types import ADMIN, Caller

ENV = "env_test"
PROCESS_KINDS = (ItemKind.COMMAND, ItemKind.MONITOR, ItemKind.SCHEDULE)


def commit_violations(tx: Transaction) -> list[str]:
    """What no committed state may show (G2)."""
    problems: list[str] = []
    runs_by_id = {r.id: r for r in tx.find(Run)}
    messages = tx.find(Message)
    for thread in tx.find(Thread):
        active = [r for r in runs_by_id.values() if r.thread_id == thread.id and r.status in ACTIVE_RUN]
        running_items = tx.find(Item, thread_id=thread.id, status=ItemStatus.RUNNING)
        settled = threads.is_settled(active, running_items)
        if thread.settled != settled:
            problems.append(f"{thread.id}: settled={thread.settled} but is_settled()={settled}")
        if thread.status != threads.status(active):
            problems.append(f"{thread.id}: status={thread.status} but runs say {threads.status(active)}")
        if thread.settled and any(i.held for i in running_items):
            problems.append(f"{thread.id}: settled with held work running")
        if thread.settled and any(not r.is_progress for r in active):
            problems.append(f"{thread.id}: settled with a non-progress run queued or running")
        if sum(r.status == RunStatus.RUNNING for r in active) > 1:
            problems.append(f"{thread.id}: more than one running run")
        ended = tx.find(Item, thread_id=thread.id, status=[ItemStatus.ENDED, ItemStatus.FAILED],
                        kind=list(PROCESS_KINDS))
        for item in ended:
            notices = [m for m in messages if (m.source or {}).get("itemId") == item.id]
            woken = [m for m in notices if m.run_id in runs_by_id
                     and runs_by_id[m.run_id].thread_id == thread.id
                     and not runs_by_id[m.run_id].is_progress]
            if not woken:
                problems.append(f"{thread.id}: {item.kind} {item.id} ended but no wake run is queued")
    return problems


class World:
    def __init__(self, path: Path, check_every_commit: bool = True) -> None:
        self.store: Store = SQLiteStore(path)
        self.violations: list[str] = []
        self.commits = 0
        #: Called after each commit (a test awaits one with it).
        self.on_commit: Callable[[], object] | None = None
        self.check_every_commit = check_every_commit
        self.commands = Commands(self.store, ENV, frozenset({"script"}), self._committed)
        self.queries = Queries(self.commands)

    def close(self) -> None:
        self.store.close()

    def _committed(self, touched: set[str]) -> None:
        self.commits += 1
        if self.on_commit is not None:
            self.on_commit()
        if self.check_every_commit:
            with self.store.transaction() as tx:
                self.violations.extend(commit_violations(tx))

    # ------------------------------------------------------------------ reads

    def tx_read(self) -> Any:
        return self.store.transaction()

    def thread(self, thread_id: str) -> Thread:
        with self.store.transaction() as tx:
            thread = tx.get(Thread, thread_id)
        assert thread is not None
        return thread

    def task(self, task_id: str) -> Task:
        with self.store.transaction() as tx:
            task = tx.get(Task, task_id)
        assert task is not None
        return task

    def run(self, run_id: str) -> Run:
        with self.store.transaction() as tx:
            run = tx.get(Run, run_id)
        assert run is not None
        return run

    def item(self, item_id: str) -> Item:
        with self.store.transaction() as tx:
            item = tx.get(Item, item_id)
        assert item is not None
        return item

    def runs(self, thread_id: str, **where: Any) -> list[Run]:
        with self.store.transaction() as tx:
            return tx.find(Run, thread_id=thread_id, **where)

    def items(self, thread_id: str, **where: Any) -> list[Item]:
        with self.store.transaction() as tx:
            return tx.find(Item, thread_id=thread_id, **where)

    def messages(self, thread_id: str) -> list[Message]:
        with self.store.transaction() as tx:
            return tx.find(Message, thread_id=thread_id)

    def messages_of(self, run_id: str) -> list[Message]:
        with self.store.transaction() as tx:
            return sorted(tx.find(Message, run_id=run_id), key=lambda m: m.seq)

    def tasks_of_child(self, child_id: str) -> list[Task]:
        with self.store.transaction() as tx:
            return sorted(tx.find(Task, child_thread_id=child_id), key=lambda t: t.created_at)

    def all_tasks(self) -> list[Task]:
        with self.store.transaction() as tx:
            return tx.find(Task)

    def running(self, thread_id: str) -> Run | None:
        found = self.runs(thread_id, status=RunStatus.RUNNING)
        assert len(found) <= 1
        return found[0] if found else None

    def queued(self, thread_id: str) -> list[Run]:
        return self.runs(thread_id, status=RunStatus.QUEUED)

    def wake_runs(self, thread_id: str) -> list[Run]:
        return [r for r in self.runs(thread_id) if r.kind == Trigger.DELEGATED_TASK]

    def wake_messages(self, thread_id: str) -> list[Message]:
        return [m for m in self.messages(thread_id) if (m.source or {}).get("kind") == Trigger.DELEGATED_TASK]

    def dump(self) -> dict[str, Any]:
        """Everything in the store, for "changes nothing" checks."""
        with self.store.transaction() as tx:
            state = {
                cls.__name__: sorted((r.to_dict() for r in tx.find(cls)), key=repr)
                for cls in (Thread, Run, Message, Item, Task)
            }
            state["outbox"] = [(r.kind, r.payload) for r in tx.outbox(10_000)]
        state["events"] = self.store.last_event_seq()
        return state

    # ------------------------------------------------------------------ acting

    def as_thread(self, thread_id: str, during_run: bool = True) -> Caller:
        run = self.running(thread_id) if during_run else None
        return Caller("thread", thread_id=thread_id, run_id=run.id if run else None)

    def parent(self, message: str = "you are the parent") -> tuple[str, str]:
        made = self.commands.create_thread(ADMIN, "script", message=message)
        return made["threadId"], made["runId"]

    def delegate(self, parent_id: str, text: str = "do the job", **kwargs: Any) -> tuple[str, str]:
        """Delegate from the parent (as its running run when it has one); (task id, child id)."""
        view = self.commands.delegate(self.as_thread(parent_id), text, provider="script", **kwargs)
        return view["taskId"], view["childThreadId"]

    def end(self, thread_id: str, reply: str | None = None, status: str = RunStatus.COMPLETED) -> str:
        """End the thread's running run (the provider's turn is over)."""
        run = self.running(thread_id)
        assert run is not None, f"{thread_id} has no running run"
        error = "it broke" if status == RunStatus.FAILED else None
        self.commands.end_run(run.id, status, reply, error)
        return run.id

    def command(self, thread_id: str, awaited: bool = False, label: str | None = None) -> str:
        return self.commands.start_process(
            self.as_thread(thread_id), "command", "sleep 5", label=label, awaited=awaited
        )["id"]

    def monitor(self, thread_id: str, persistent: bool = False, label: str | None = None) -> str:
        return self.commands.start_process(
            self.as_thread(thread_id), "monitor", "tail -f log", label=label, persistent=persistent
        )["id"]

    def schedule(self, thread_id: str, text: str = "wake up", hold: bool = False) -> str:
        return self.commands.schedule(self.as_thread(thread_id), 60_000, text, hold)["id"]
