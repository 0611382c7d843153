"""Commands: every change to tether is one of these, applied in order, in one transaction.

Each public method opens a :class:`Unit`, changes records through the pure domain rules,
appends events and outbox rows, then — still inside the transaction — reconciles every
thread it touched (start the next run, recompute settled, turn a settled child's reply
into its task's result, queue the parent's wake). Only then does it commit. So a child's
answer and its parent's wake, or a background item's end and its wake run (G2), become
visible together or not at all.

Side effects (start a provider turn, spawn or kill a process, arm a timer, call a peer)
are outbox rows; :mod:`tether.engine.runtime` carries them out after the commit.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from tether.domain import background, deadlines, runs, tasks, threads
from tether.domain.records import Item, Link, Message, Run, Send, Task, Thread
from tether.domain.types import (
    ACTIVE_RUN,
    OPEN_TASK,
    Delivery,
    DomainError,
    ItemKind,
    ItemStatus,
    OnDeadline,
    RunStatus,
    TaskStatus,
    Trigger,
)
from tether.domain.views import item_view, message_view, run_view, task_view, thread_summary
from tether.engine.unit import Unit, View
from tether.errors import Conflict, Forbidden, Invalid, NotFound
from tether.ids import format_time, new_id, now, parse_time
from tether.store.base import OutboxRow, Store
from tether.types import Caller

#: The parent environment of tasks an A2A client started (SPEC §14): the client's context
#: id stands in as the parent thread, and the client reads results over A2A.
A2A_PARENT = "a2a"

log = logging.getLogger(__name__)

#: A flush of deferred writes that failed (the store was locked, say) is tried again after
#: this many seconds, unless a command carries them first.
FLUSH_RETRY = 1.0

#: A write that nothing waits on, applied later inside some command's unit (see ``_later``).
Deferred = Callable[[Unit], object]

_TERMINAL_ITEM = {
    TaskStatus.COMPLETED: ItemStatus.ENDED,
    TaskStatus.FAILED: ItemStatus.FAILED,
    TaskStatus.INTERRUPTED: ItemStatus.FAILED,
    TaskStatus.CANCELLED: ItemStatus.CANCELLED,
}


class Commands:
    def __init__(
        self,
        store: Store,
        environment_id: str,
        providers: Mapping[str, Any] | Iterable[str] = ("script",),
        on_commit: Callable[[set[str]], None] | None = None,
    ) -> None:
        self.store = store
        self.environment_id = environment_id
        #: name -> provider; only ``check()`` is used here, to refuse an unusable one early.
        self.providers: Mapping[str, Any] = (
            providers if isinstance(providers, Mapping) else dict.fromkeys(providers)
        )
        self._on_commit = on_commit
        #: ``[tasks] default_deadline_ms`` of ``config.toml``: the deadline of every task
        #: delegated from here without one of its own (None: no deadline).
        self.default_deadline_ms: int | None = None
        #: Writes of running turns not yet applied, oldest first (see ``_later``).
        self._deferred: list[Deferred] = []
        self._flush_armed = False

    # ------------------------------------------------------------------ plumbing

    @contextmanager
    def unit(self) -> Iterator[Unit]:
        """One command's transaction. Deferred writes go first, in order, so the command
        (and everything after it) sees them; a rollback hands them to the next command."""
        deferred, self._deferred = self._deferred, []
        try:
            with self.store.transaction() as tx:
                u = Unit(tx, self.environment_id)
                self._apply_deferred(u, deferred)
                yield u
                self._settle(u)
        except BaseException:
            self._deferred[:0] = deferred
            raise
        if self._on_commit and u.touched:
            self._on_commit(u.touched)

    @contextmanager
    def view(self) -> Iterator[View]:
        """A read-only snapshot for queries: no write lock, no settle step, no commit hook.
        It sees every command whole or not at all, since a command is one transaction.
        Deferred writes are applied first, so a reader in this process reads its writes."""
        self.flush()
        with self.store.read() as reader:
            yield View(reader, self.environment_id)

    # ------------------------------------------------------------------ deferred writes

    def _later(self, write: Deferred) -> None:
        """Queue a write that nothing waits on — a turn's start time, its provider state,
        what it says — instead of committing it alone. It joins the transaction of the next
        command (whichever comes first: that run's next tool call or its end, another
        command, a query) or, failing that, its own one on the loop's next turn. Writes are
        only delayed, never reordered, so this is the same history with fewer commits: a
        crash before the flush loses what a crash a moment earlier would have lost. Each
        write re-checks what it depends on (its run still running) and must not raise.
        Without a running loop (scripts, tests) it is applied at once."""
        self._deferred.append(write)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        if not self._flush_armed:
            self._flush_armed = True
            loop.call_soon(self._flush_soon)

    def _claim(self, write: Callable[[Unit], bool]) -> bool:
        """A write that says this process owns a run or a process. Several processes on one
        store (SPEC §12) need its answer before they go on, so it commits at once; a process
        alone on its store owns everything, so it is deferred (``_later``) and holds."""
        if self.store.shared:
            with self.unit() as u:
                return write(u)
        self._later(write)
        return True

    def _flush_soon(self) -> None:
        self._flush_armed = False
        try:
            self.flush()
        except Exception:
            log.exception("deferred writes could not be committed; trying again")
            self._flush_armed = True
            asyncio.get_running_loop().call_later(FLUSH_RETRY, self._flush_soon)

    def flush(self) -> None:
        """Commit the deferred writes now (one transaction), if there are any."""
        if self._deferred:
            with self.unit():
                pass

    def _apply_deferred(self, u: Unit, deferred: list[Deferred]) -> None:
        for write in list(deferred):
            try:
                write(u)
            except Exception:
                # A bug, not a state: drop that write (the transaction rolls back and the
                # others move on to the next command) rather than fail every command after.
                log.exception("a deferred write failed and was dropped")
                deferred.remove(write)
                raise

    def _once(
        self, caller: Caller, name: str, key: str | None, body: Callable[[Unit], dict[str, Any]]
    ) -> dict[str, Any]:
        """Run ``body`` in one unit, at most once per (caller, ``name``, ``key``) (G9)."""
        with self.unit() as u:
            if key:
                seen = u.tx.get_request(caller.scope, f"{name}:{key}")
                if seen is not None:
                    return seen
            result = body(u)
            if key:
                u.tx.put_request(caller.scope, f"{name}:{key}", result)
            return result

    # ------------------------------------------------------------------ access (G10)

    def visible(self, u: View, caller: Caller, thread: Thread) -> bool:
        if caller.kind == "admin":
            return True
        if caller.kind == "link":
            return thread.token_id == caller.token_id
        # A thread (its run, or an agent holding its credential) sees itself, the children
        # its tasks created, and its own parent — not its neighbours.
        if thread.id == caller.thread_id or self._parent_of(thread) == caller.thread_id:
            return True
        own = u.load(Thread, caller.thread_id)
        return own is not None and self._parent_of(own) == thread.id

    def _parent_of(self, thread: Thread) -> str | None:
        parent = thread.parent or {}
        return parent.get("threadId") if parent.get("environmentId") == self.environment_id else None

    def thread_for(self, u: View, caller: Caller, thread_id: str) -> Thread:
        thread = u.load(Thread, thread_id)
        if thread is None or not self.visible(u, caller, thread):
            raise NotFound(f"no thread with id {thread_id!r}")
        return thread

    def task_for(self, u: View, caller: Caller, task_id: str) -> Task:
        task = u.load(Task, task_id)
        if task is not None:
            for thread_id in (task.child_thread_id, task.parent_thread_id):
                thread = u.load(Thread, thread_id) if self._local_side(task, thread_id) else None
                if thread is not None and self.visible(u, caller, thread):
                    return task
        raise NotFound(f"no task with id {task_id!r}")

    def _local_side(self, task: Task, thread_id: str) -> bool:
        if thread_id == task.child_thread_id:
            return task.child_environment_id == self.environment_id
        return task.parent_environment_id == self.environment_id

    # ------------------------------------------------------------------ threads, messages

    def create_thread(
        self,
        caller: Caller,
        provider: str,
        title: str | None = None,
        message: str | None = None,
        client_request_id: str | None = None,
        model: str | None = None,
    ) -> dict[str, Any]:
        self.check_provider(provider)

        def body(u: Unit) -> dict[str, Any]:
            thread = self._new_thread(u, provider, title, token_id=caller.token_id, model=model)
            run_id = None
            if message is not None:
                source = {"kind": Trigger.USER}
                run_id = self._post(u, thread, message, source, Trigger.USER).id
            return {"threadId": thread.id, "runId": run_id}

        return self._once(caller, "create_thread", client_request_id, body)

    def check_provider(self, name: str) -> None:
        if name not in self.providers:
            known = ", ".join(sorted(self.providers))
            raise Invalid(f"unknown provider {name!r}; this environment has: {known}")
        problem = getattr(self.providers[name], "check", lambda: None)()
        if problem:
            raise Invalid(f"provider {name!r} is not usable here: {problem}")

    def _new_thread(
        self,
        u: Unit,
        provider: str,
        title: str | None,
        token_id: str | None = None,
        parent: dict[str, Any] | None = None,
        task_id: str | None = None,
        model: str | None = None,
    ) -> Thread:
        thread = Thread(
            id=new_id("thr"),
            provider=provider,
            model=model,
            created_at=u.at,
            title=title,
            parent=parent,
            root_task_id=task_id,
            open_task_id=task_id,
            latest_task_id=task_id,
            token_id=token_id,
        )
        u.save(thread)
        u.emit("thread.created", thread_summary(thread, self.environment_id), thread_id=thread.id)
        return thread

    def post_message(
        self,
        caller: Caller,
        thread_id: str,
        text: str,
        mode: str = "auto",
        client_request_id: str | None = None,
    ) -> dict[str, Any]:
        """A message to a thread. From another thread (or through a link with an origin)
        it is a ``message`` trigger; from a person or API client a ``user`` trigger.

        ``now`` steers: in the same transaction the running run is stopped (the thread's
        task stays open — the new run's answer is the one that counts) and the message's
        own run goes ahead of every queued run, so no earlier queued message runs first."""
        if mode not in runs.MESSAGE_MODES:
            raise Invalid(f"mode must be one of {', '.join(runs.MESSAGE_MODES)}, not {mode!r}")

        def body(u: Unit) -> dict[str, Any]:
            thread = self.thread_for(u, caller, thread_id)
            origin = self._origin(caller)
            if origin is not None:
                source = {"kind": Trigger.MESSAGE, "origin": origin}
                kind = Trigger.MESSAGE
            else:
                source, kind = {"kind": Trigger.USER}, Trigger.USER
            if origin and self._is_parent(thread, origin) and thread.root_task_id:
                self._follow_up_on_send(u, thread)
            stopped = self._supersede(u, thread) if mode == "now" else []
            busy = bool(u.query(Run, thread_id=thread.id, status=list(ACTIVE_RUN)))
            run = self._post(u, thread, text, source, kind, first=mode == "now")
            answer = {"messageId": run.trigger["messageIds"][-1], "runId": run.id}
            answer["delivery"] = "queued" if busy and mode != "now" else "started"
            return answer | ({"stoppedRuns": stopped} if mode == "now" else {})

        return self._once(caller, f"post_message:{thread_id}", client_request_id, body)

    def check_origin(self, origin: dict[str, Any]) -> None:
        """A link call's origin names the *caller's* environment and thread. It is trusted
        only inside the token's fence (SPEC §1), so it may never name this environment:
        that would make a local thread the token did not create a parent, and wake it."""
        if not origin.get("environmentId") or not origin.get("threadId"):
            raise Invalid("origin needs environmentId and threadId")
        if origin["environmentId"] == self.environment_id:
            raise Forbidden("a link call's origin cannot be this environment")

    def _origin(self, caller: Caller) -> dict[str, Any] | None:
        if caller.origin:
            self.check_origin(caller.origin)
            return caller.origin
        if caller.kind == "thread":
            return {"environmentId": self.environment_id, "threadId": caller.thread_id}
        return None

    @staticmethod
    def _is_parent(thread: Thread, origin: dict[str, Any]) -> bool:
        parent = thread.parent or {}
        return parent.get("threadId") == origin.get("threadId") and parent.get("environmentId") == origin.get(
            "environmentId"
        )

    def _follow_up_on_send(self, u: Unit, thread: Thread) -> None:
        """The parent wrote to its child after the task completed: a follow-up opens now,
        and the child's next answer completes it (SPEC §1 Follow-ups)."""
        if thread.open_task_id is None and not thread.cancelled:
            self._open_follow_up(u, thread)

    def _post(
        self, u: Unit, thread: Thread, text: str, source: dict[str, Any], kind: str, first: bool = False
    ) -> Run:
        message = self._message(u, thread, "user", text, source)
        return self._queue(u, thread, kind, [message], **({"first": True} if first else {}))

    def _message(
        self,
        u: Unit,
        thread: Thread,
        role: str,
        text: str,
        source: dict[str, Any] | None = None,
        run_id: str | None = None,
    ) -> Message:
        thread.message_count += 1
        u.save(thread)
        message = Message(
            id=new_id("msg"),
            thread_id=thread.id,
            seq=thread.message_count,
            role=role,
            text=text,
            created_at=u.at,
            source=source,
            run_id=run_id,
        )
        u.save(message)
        u.emit("message.created", message_view(message), thread_id=thread.id, run_id=run_id)
        return message

    # ------------------------------------------------------------------ runs

    def _queue(
        self,
        u: Unit,
        thread: Thread,
        kind: str,
        messages: list[Message],
        key: str | None = None,
        **extra: Any,
    ) -> Run:
        """Queue a run for ``kind`` — or fold the messages into a queued run that takes them."""
        run = next(
            (
                r
                for r in u.query(Run, thread_id=thread.id, status=RunStatus.QUEUED)
                if runs.folds_into(r, kind, key)
            ),
            None,
        )
        if run is None:
            thread.run_count += 1
            u.save(thread)
            trigger = {"kind": str(kind), "key": key, "messageIds": [], **extra}
            run = Run(new_id("run"), thread.id, thread.run_count, trigger, queued_at=u.at)
            event = "run.queued"
        else:
            event = "run.folded"
        run.trigger = {**run.trigger, "messageIds": run.trigger["messageIds"] + [m.id for m in messages]}
        for message in messages:
            message.run_id = run.id
            u.save(message)
        u.save(run)
        u.emit(event, run_view(run), thread_id=thread.id, run_id=run.id)
        u.mark(thread.id)
        return run

    def _supersede(self, u: Unit, thread: Thread) -> list[str]:
        """Stop the running run for a ``now`` message; unlike ``thread_interrupt`` the
        thread's open task is not marked interrupted, since the new run answers it."""
        stopped = []
        for run in u.query(Run, thread_id=thread.id, status=RunStatus.RUNNING):
            self._end_run(u, run, RunStatus.INTERRUPTED, run.reply, "stopped for a newer message")
            u.outbox("run.stop", {"runId": run.id}, thread.id)
            stopped.append(run.id)
        return stopped

    def _dispatch(self, u: Unit, thread: Thread) -> None:
        """One run at a time per thread, in order: start the next queued run if none runs."""
        active = u.query(Run, thread_id=thread.id, status=list(ACTIVE_RUN))
        if any(run.status == RunStatus.RUNNING for run in active) or not active:
            return
        run = runs.next_to_start(active)
        runs.start(run, u.at)
        u.save(run)
        u.emit("run.started", run_view(run), thread_id=thread.id, run_id=run.id)
        u.outbox("run.execute", {"runId": run.id}, thread.id)
        self._on_run_started(u, thread, run)

    def _on_run_started(self, u: Unit, thread: Thread, run: Run) -> None:
        if run.kind == Trigger.DELEGATED_TASK:
            self._advance(u, run.trigger.get("taskIds", []), Delivery.DELIVERED)
        if thread.root_task_id is None or run.is_progress:
            return
        task = u.load(Task, thread.open_task_id)
        if task is not None:
            tasks.mark_running(task)
            self._save_task(u, task)
        elif not thread.cancelled:
            follow_up = self._open_follow_up(u, thread)
            tasks.mark_running(follow_up)
            self._save_task(u, follow_up)

    def end_run(self, run_id: str, status: str, reply: str | None = None, error: str | None = None) -> None:
        with self.unit() as u:
            run = u.need(Run, run_id, "run")
            if run.status != RunStatus.RUNNING:
                return  # already ended by a cancel or an interrupt
            self._end_run(u, run, status, reply, error)

    def _end_run(
        self, u: Unit, run: Run, status: str, reply: str | None = None, error: str | None = None
    ) -> None:
        started = run.started_at is not None
        runs.finish(run, status, u.at, reply, error)
        u.save(run)
        u.emit("run.ended", run_view(run), thread_id=run.thread_id, run_id=run.id)
        thread = u.need(Thread, run.thread_id, "thread")
        u.mark(thread.id)
        if run.kind == Trigger.DELEGATED_TASK and started:
            self._advance(u, run.trigger.get("taskIds", []), Delivery.ACKNOWLEDGED)
        if thread.root_task_id is None or not started:
            return
        if run.is_progress:
            task = u.load(Task, thread.open_task_id or thread.latest_task_id)
            if task is not None:
                tasks.note_progress(task, run)
                self._save_task(u, task)
            return
        thread.pending_answer_run_id = run.id
        u.save(thread)
        task = u.load(Task, thread.open_task_id)
        if task is not None:
            tasks.note_reply(task, run)
            self._save_task(u, task)

    def begin_turn(self, run_id: str, member: str | None = None) -> bool:
        """The provider turn begins now, in process ``member``: that moment becomes the
        run's ``startedAt`` (dispatch set a first one). False when the run ended meanwhile or
        another process runs it. Alone on its store the write is deferred (``_claim``)."""
        at = now()

        def write(u: Unit) -> bool:
            run = u.load(Run, run_id)
            if run is None or run.status != RunStatus.RUNNING or run.member not in (None, member):
                return False
            run.started_at, run.member = at, member
            u.save(run)
            return True

        return self._claim(write)

    def run_guard(self, u: View, run_id: str | None) -> Run | None:
        """Tools called from a run act only while it runs: a cancelled run's late actions
        must change nothing."""
        run = u.load(Run, run_id)
        if run is not None and run.status != RunStatus.RUNNING:
            raise Conflict(f"run {run.id} has ended ({run.status})", code="run_ended")
        return run

    def say(self, caller: Caller, text: str) -> None:
        """An assistant message written during the caller's run (deferred, ``_later``)."""

        def write(u: Unit) -> None:
            thread = self._turn_thread(u, caller)
            if thread is not None:
                self._message(u, thread, "assistant", text, run_id=caller.run_id)

        self._turn_write(caller, write)

    def set_state(self, caller: Caller, state: dict[str, Any]) -> None:
        """Replace a thread's provider state (the script's fired rules and action ids);
        deferred (``_later``)."""

        def write(u: Unit) -> None:
            thread = self._turn_thread(u, caller)
            if thread is not None:
                thread.state = state
                u.save(thread)

        self._turn_write(caller, write)

    def _turn_write(self, caller: Caller, write: Deferred) -> None:
        """Refuse a write of an ended run at once (a snapshot read, no write lock), else
        defer it. Deferred writes never end runs, so the snapshot needs no flush."""
        with self.store.read() as reader:
            u = View(reader, self.environment_id)
            self.run_guard(u, caller.run_id)
            u.need(Thread, caller.thread_id or "", "thread")
        self._later(write)

    def _turn_thread(self, u: Unit, caller: Caller) -> Thread | None:
        """The caller's thread, if its run still runs (checked again when applied)."""
        run = u.load(Run, caller.run_id)
        if run is not None and run.status != RunStatus.RUNNING:
            return None
        return u.load(Thread, caller.thread_id)

    # ------------------------------------------------------------------ reconcile

    def _settle(self, u: Unit) -> None:
        """Before commit: dispatch and reconcile every touched thread until nothing moves."""
        while u.dirty:
            thread_id = next(iter(u.dirty))
            del u.dirty[thread_id]
            thread = u.load(Thread, thread_id)
            if thread is not None:
                self._dispatch(u, thread)
                self._reconcile(u, thread)

    def _reconcile(self, u: Unit, thread: Thread) -> None:
        active = u.query(Run, thread_id=thread.id, status=list(ACTIVE_RUN))
        # Only whether something holds the thread matters: one held item is enough.
        items = u.query(Item, limit=1, thread_id=thread.id, held=True)
        settled = threads.is_settled(active, items)
        status = threads.status(active)
        if (thread.status, thread.settled) != (status, settled):
            thread.status, thread.settled = status, settled
            u.save(thread)
            u.emit("thread.updated", thread_summary(thread, self.environment_id), thread_id=thread.id)
        if thread.root_task_id is None:
            return
        task = u.load(Task, thread.open_task_id)
        if task is not None:
            state = threads.work_state(active, items)
            if task.work_state != state:
                task.work_state = state
                self._save_task(u, task)
        busy = bool(active) or u.reader.count(Item, thread_id=thread.id, status=ItemStatus.RUNNING) > 0
        self._note_child_active(u, thread, busy)  # before the answer: its event carries it
        if settled and not thread.cancelled and (thread.pending_answer_run_id or task):
            answer = u.load(Run, thread.pending_answer_run_id)
            thread.pending_answer_run_id = None
            u.save(thread)
            self._answer(u, thread, answer)
            self._note_child_active(u, thread, busy)  # the answer may have opened a follow-up

    def _note_child_active(self, u: Unit, thread: Thread, active: bool) -> None:
        """Mark the child's latest task while the child still has work that will wake it
        (a run, or any background work): a follow-up may yet come, so its parent is not
        done waiting even though the task ended (SPEC §10; mirrored to a remote origin)."""
        latest = u.load(Task, thread.latest_task_id)
        if latest is None or not self._local_side(latest, latest.child_thread_id):
            return
        wanted = active and not thread.cancelled
        if latest.child_active == wanted:
            return
        latest.child_active = wanted
        self._save_task(u, latest)
        if wanted:  # a new stretch of work: no earlier task of this child stays marked
            for task in u.query(Task, child_thread_id=thread.id):
                if task.child_active and task.id != latest.id:
                    task.child_active = False
                    self._save_task(u, task)

    def _answer(self, u: Unit, thread: Thread, answer: Run | None) -> None:
        """The child settled: its last answer completes the open task or a new follow-up (G1)."""
        task = u.load(Task, thread.open_task_id) or self._open_follow_up(u, thread)
        tasks.complete(task, answer, u.at, interrupted=thread.interrupted)
        thread.open_task_id = None
        thread.interrupted = False
        u.save(thread)
        self._save_task(u, task, "task.completed")
        self._task_ended(u, task)

    def _open_follow_up(self, u: Unit, thread: Thread) -> Task:
        root = u.need(Task, thread.root_task_id or "", "task")
        follow_up = tasks.follow_up(root, new_id("tsk"), u.at)
        root.follow_ups.append(follow_up.id)
        self._save_task(u, root)
        thread.open_task_id = thread.latest_task_id = follow_up.id
        u.save(thread)
        self._save_task(u, follow_up, "task.created")
        if follow_up.parent_environment_id == self.environment_id:
            self._task_item(u, follow_up, hold=False)
        return follow_up

    def _save_task(self, u: Unit, task: Task, event: str = "task.updated") -> None:
        u.save(task)
        thread_id = (
            task.child_thread_id if self._local_side(task, task.child_thread_id) else task.parent_thread_id
        )
        u.emit(event, task_view(task), thread_id=thread_id, task_id=task.id)
        if task.parent_environment_id == A2A_PARENT and event != "task.delivery":
            self._a2a_push(u, task)

    def _task_item(self, u: Unit, task: Task, hold: bool) -> Item:
        item = Item(
            id=new_id("bg"),
            thread_id=task.parent_thread_id,
            kind=ItemKind.TASK,
            started_at=u.at,
            label=task.title,
            hold=hold,
            task_id=task.id,
            environment_id=task.child_environment_id,
            due_at=task.deadline_at,
        )
        # The deadline is armed here, in the parent's environment (the origin): it fires
        # even while a remote child's link is down, and the timer re-arms it after a restart.
        return self._start_item(u, item, "timer.arm" if task.deadline_at else None)

    @staticmethod
    def _start_item(u: Unit, item: Item, outbox: str | None = None) -> Item:
        """Record a new background item (and the side effect that starts it, carried out by
        the process the item belongs to, if it belongs to one)."""
        u.save(item)
        u.emit("item.started", item_view(item), thread_id=item.thread_id)
        if outbox:
            u.outbox(outbox, {"itemId": item.id, **_on(item.member)}, item.thread_id)
        u.mark(item.thread_id)
        return item

    # ------------------------------------------------------------------ task endings, wakes

    def _task_ended(self, u: Unit, task: Task, by_parent: bool = False) -> None:
        """A task is terminal: end its item in the parent and deliver its result (G3)."""
        for item in u.query(Item, task_id=task.id, status=ItemStatus.RUNNING):
            background.end(item, _TERMINAL_ITEM[TaskStatus(task.status)], u.at)
            u.save(item)
            u.emit("item.ended", item_view(item), thread_id=item.thread_id)
            u.mark(item.thread_id)
        if task.parent_environment_id != self.environment_id:
            return  # the origin environment delivers; it follows our event feed
        parent = u.load(Thread, task.parent_thread_id)
        if task.waiting_call:
            task.delivered_as = "call"
            tasks.advance_delivery(task, Delivery.CLAIMED)
            self._save_task(u, task, "task.delivery")
        elif by_parent or parent is None:
            tasks.advance_delivery(task, Delivery.DISPOSED)
            self._save_task(u, task, "task.delivery")
        else:
            self._wake(u, parent, task)

    def _wake(self, u: Unit, parent: Thread, task: Task) -> None:
        """One completion wake per result; results folding into a wake not yet started."""
        if task.delivery_state != Delivery.PENDING:
            return
        run = next(
            (
                r
                for r in u.query(Run, thread_id=parent.id, status=RunStatus.QUEUED)
                if runs.folds_into(r, Trigger.DELEGATED_TASK, None)
            ),
            None,
        )
        if run is not None:
            task_ids = [*run.trigger["taskIds"], task.id]
            run.trigger = {**run.trigger, "taskIds": task_ids}
            u.save(run)
            u.emit("run.folded", run_view(run), thread_id=parent.id, run_id=run.id)
            message = u.need(Message, run.trigger["messageIds"][0], "message")
            # Appended, not rebuilt from every folded task: their parts never change (each
            # is terminal), and decoding them all made a big fan-in quadratic.
            message.text = f"{message.text}\n\n{tasks.wake_text([task])}"
            message.source = {"kind": Trigger.DELEGATED_TASK, "taskIds": task_ids}
            u.save(message)
            u.emit("message.updated", message_view(message), thread_id=parent.id, run_id=run.id)
        else:
            source = {"kind": Trigger.DELEGATED_TASK, "taskIds": [task.id]}
            message = self._message(u, parent, "notification", tasks.wake_text([task]), source)
            run = self._queue(u, parent, Trigger.DELEGATED_TASK, [message], taskIds=[task.id])
        task.delivered_as = "follow-up" if task.follow_up_of else "result"
        task.wake_message_id, task.wake_run_id = message.id, run.id
        tasks.advance_delivery(task, Delivery.CLAIMED)
        self._save_task(u, task, "task.delivery")

    def _advance(self, u: Unit, task_ids: list[str], to: Delivery) -> None:
        for task_id in task_ids:
            task = u.load(Task, task_id)
            if task is not None and tasks.advance_delivery(task, to):
                self._save_task(u, task, "task.delivery")

    # ------------------------------------------------------------------ delegation

    def delegate(
        self,
        caller: Caller,
        task: str,
        *,
        provider: str | None = None,
        mode: str = "async",
        hold: bool = True,
        title: str | None = None,
        client_request_id: str | None = None,
        model: str | None = None,
        deadline_ms: int | None = None,
        on_deadline: str | None = None,
    ) -> dict[str, Any]:
        """``delegate_task`` to this environment: a task, its child thread, and the held
        item in the parent — one transaction, so a retry finds all three or none (G9)."""
        if mode not in ("async", "wait"):
            raise Invalid(f"mode must be 'async' or 'wait', not {mode!r}")
        if not task.strip():
            raise Invalid("task must not be empty")
        self._check_deadline(deadline_ms, on_deadline)

        def body(u: Unit) -> dict[str, Any]:
            parent = self._acting_thread(u, caller)
            record = Task(
                id=new_id("tsk"),
                parent_environment_id=self.environment_id,
                parent_thread_id=parent.id,
                child_environment_id=self.environment_id,
                child_thread_id="",
                created_at=u.at,
                title=title,
                mode=mode,
                hold=hold,
                waiting_call=mode == "wait",
            )
            deadlines.set_deadline(record, deadline_ms, on_deadline, self.default_deadline_ms)
            chosen = provider or _default_provider(task, parent.provider)
            self._child(u, record, task, chosen, parent.token_id, origin=None, model=model)
            self._task_item(u, record, hold)
            self._settle(u)  # the child's first run has started: answer with that state
            return task_view(record)

        return self._once(caller, "delegate", client_request_id, body)

    @staticmethod
    def _check_deadline(deadline_ms: int | None, on_deadline: str | None) -> None:
        try:
            deadlines.check(deadline_ms, on_deadline)
        except DomainError as error:
            raise Invalid(str(error)) from None

    def deadline_due(self, item_id: str) -> None:
        """A task's deadline came due (the timer says when; also one that fell due while we
        were down): the parent is told once, or the task is cancelled (SPEC §11). The
        ``overdue`` mark and the notice (or the cancel and its wake) are one transaction,
        so a deadline fires at most once; an answer that came first leaves nothing to do."""
        with self.unit() as u:
            item = u.load(Item, item_id)
            task = u.load(Task, item.task_id) if item is not None else None
            if item is None or task is None or not item.is_running or item.due_at is None:
                return
            item.due_at = None  # disarmed: nothing more is due for this item
            u.save(item)
            u.emit("item.updated", item_view(item), thread_id=item.thread_id)
            action = deadlines.passed(task)
            if action is None:
                return
            self._save_task(u, task)
            if action == OnDeadline.CANCEL:
                self._cancel(u, task, by_parent=False, reason="deadline")
            else:
                self._deadline_notice(u, task)

    def _deadline_notice(self, u: Unit, task: Task) -> None:
        """One ``task_deadline`` notification and run in the parent: which task, and how it
        stands — what its child still holds on (local), or the link's state (remote)."""
        parent = u.load(Thread, task.parent_thread_id)
        if parent is None:
            return
        local = self._local_side(task, task.child_thread_id)
        held = u.query(Item, thread_id=task.child_thread_id, held=True) if local else []
        link = None if local else u.load(Link, task.child_environment_id)
        source = {
            "kind": Trigger.TASK_DEADLINE,
            "taskId": task.id,
            "title": task.title,
            "status": task.status,
            "workState": task.work_state,
        }
        message = self._message(u, parent, "notification", deadlines.notice_text(task, held, link), source)
        self._queue(u, parent, Trigger.TASK_DEADLINE, [message], key=task.id, taskId=task.id)

    def _child(
        self,
        u: Unit,
        task: Task,
        text: str,
        provider: str,
        token_id: str | None,
        origin: dict[str, Any] | None,
        model: str | None = None,
    ) -> Thread:
        self.check_provider(provider)
        parent = {
            "environmentId": task.parent_environment_id,
            "threadId": task.parent_thread_id,
            "taskId": task.id,
        }
        child = self._new_thread(u, provider, task.title, token_id, parent, task.id, model)
        task.child_thread_id = child.id
        self._save_task(u, task, "task.created")
        source = {"kind": Trigger.TASK, "taskId": task.id, "origin": origin or parent}
        self._post(u, child, text, source, Trigger.TASK)
        return child

    def _acting_thread(self, u: Unit, caller: Caller) -> Thread:
        if caller.thread_id is None:
            raise Invalid("delegate_task must be called as a thread (a run or a thread credential)")
        self.run_guard(u, caller.run_id)
        return u.need(Thread, caller.thread_id, "thread")

    def end_wait(self, task_id: str) -> dict[str, Any] | None:
        """A wait-mode call stops waiting. Terminal: it takes the result (no wake, G3).
        Not yet: it returns ``timedOut`` and the completion wake comes later (G8)."""
        with self.unit() as u:
            task = u.need(Task, task_id, "task")
            if task.waiting_call and task.status not in OPEN_TASK:
                task.waiting_call = False
                tasks.advance_delivery(task, Delivery.DELIVERED)
                tasks.advance_delivery(task, Delivery.ACKNOWLEDGED)
                self._save_task(u, task, "task.delivery")
                return task_view(task)
            task.waiting_call = False
            u.save(task)
            return None

    def cancel_task(self, caller: Caller, task_id: str, reason: str | None = None) -> dict[str, Any]:
        with self.unit() as u:
            task = self.task_for(u, caller, task_id)
            if task.is_open:
                by_parent = caller.thread_id == task.parent_thread_id
                self._cancel(u, task, by_parent, reason)
            return {"taskId": task.id, "status": task.status}

    def _cancel(self, u: Unit, task: Task, by_parent: bool, reason: str | None) -> None:
        tasks.cancel(task, u.at)
        task.waiting_call = False
        task.cancel_reason = reason
        self._save_task(u, task, "task.completed")
        child = u.load(Thread, task.child_thread_id) if self._local_side(task, task.child_thread_id) else None
        if child is not None:
            child.cancelled = True
            other = u.load(Task, child.open_task_id)
            child.open_task_id = child.pending_answer_run_id = None
            u.save(child)
            if other is not None and other.id != task.id and other.is_open:
                self._cancel(u, other, by_parent, reason)
            self._stop(u, child, reason or "task cancelled", RunStatus.CANCELLED, stop_all=True)
        else:
            task.remote_pending = "cancel"
            u.save(task)
            u.outbox("peer.push", {"environmentId": task.child_environment_id})
        self._task_ended(u, task, by_parent)

    def interrupt(self, caller: Caller, thread_id: str, stop: bool = False) -> dict[str, Any]:
        """``thread_interrupt``: stop the running run; with ``stop``, also the queued runs and
        all background work. The child's task then ends ``interrupted``."""
        with self.unit() as u:
            thread = self.thread_for(u, caller, thread_id)
            return self._stop(u, thread, "interrupted", RunStatus.INTERRUPTED, stop_all=stop)

    def _stop(self, u: Unit, thread: Thread, reason: str, status: str, stop_all: bool) -> dict[str, Any]:
        stopped_runs, stopped_items = [], []
        for run in u.query(Run, thread_id=thread.id, status=list(ACTIVE_RUN)):
            if run.status == RunStatus.RUNNING:
                self._end_run(u, run, status, run.reply, reason)
                u.outbox("run.stop", {"runId": run.id, **_on(run.member)}, thread.id)
            elif stop_all and run.kind != Trigger.DELEGATED_TASK:
                # A queued completion wake is delivery, not work: stopping the thread
                # must not drop the answers it carries (G1); it runs after the stop.
                self._end_run(u, run, RunStatus.CANCELLED, error=reason)
            else:
                continue
            stopped_runs.append(run.id)
        if stop_all:
            for item in u.query(Item, thread_id=thread.id, status=ItemStatus.RUNNING):
                stopped_items.append(item.id)
                if item.kind == ItemKind.TASK:
                    nested = u.load(Task, item.task_id)
                    if nested is not None and nested.is_open:
                        self._cancel(u, nested, True, reason)
                        continue
                background.end(item, ItemStatus.CANCELLED, u.at, reason=reason)
                u.save(item)
                u.emit("item.ended", item_view(item), thread_id=thread.id)
                if item.kind in (ItemKind.COMMAND, ItemKind.MONITOR):
                    u.outbox("process.kill", {"itemId": item.id, **_on(item.member)}, thread.id)
        if status == RunStatus.INTERRUPTED and (stopped_runs or stopped_items) and thread.open_task_id:
            thread.interrupted = True  # its task ends "interrupted", whatever the last reply
            u.save(thread)
        u.mark(thread.id)
        return {"threadId": thread.id, "stoppedRuns": stopped_runs, "stoppedItems": stopped_items}

    # ------------------------------------------------------------------ background work

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
        with self.unit() as u:
            thread = self._acting_thread(u, caller)
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
            self._start_item(u, item, "process.start" if spawn else None)
            return item_view(item)

    def process_spawned(
        self, item_id: str, pid: int, pid_start: str | None, member: str | None = None
    ) -> bool:
        """Record the pid (and the process ``member`` that spawned it). False when the item
        ended meanwhile: kill it. Alone on its store the write is deferred (``_claim``; the
        pid file the spawn wrote already tells a restart that it ran) and an item that ended
        meanwhile gets its process killed by an outbox row."""

        def write(u: Unit) -> bool:
            item = u.load(Item, item_id)
            if item is None:
                return False
            item.pid, item.pid_start, item.member = pid, pid_start, member
            u.save(item)
            if not item.is_running and not self.store.shared:
                u.outbox("process.kill", {"itemId": item.id}, item.thread_id)
            return item.is_running

        return self._claim(write)

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
        with self.unit() as u:
            item = u.need(Item, item_id, "background item")
            if not item.is_running:
                return
            if lines:
                self._monitor_lines(u, item, lines, offset)
            status = ItemStatus.ENDED if reason in (None, "timeout") else ItemStatus.FAILED
            self._item_ended(u, item, status, exit_code, reason, tail)

    def _item_ended(
        self,
        u: Unit,
        item: Item,
        status: str,
        exit_code: int | None,
        reason: str | None,
        tail: str | None = None,
        trigger: str | None = None,
    ) -> None:
        background.end(item, status, u.at, exit_code, reason)
        u.save(item)
        u.emit("item.ended", item_view(item), thread_id=item.thread_id)
        thread = u.need(Thread, item.thread_id, "thread")
        text = background.end_text(item) + (f"\n{tail}" if tail else "")
        kind = trigger or background.WAKE_TRIGGER[ItemKind(item.kind)]
        source = {"kind": kind, "itemId": item.id, "label": item.label, "exitCode": exit_code}
        message = self._message(u, thread, "notification", text, source)
        if kind == Trigger.MONITOR_FINISHED:
            self._fold_monitor_events(u, thread, item)
        self._queue(u, thread, kind, [message], key=item.id if kind != Trigger.RESTART else None)

    def _fold_monitor_events(self, u: Unit, thread: Thread, item: Item) -> None:
        """Lines not yet handled when their monitor ends join its ``monitor_finished`` run."""
        for run in u.query(Run, thread_id=thread.id, status=RunStatus.QUEUED):
            if runs.folds_into(run, Trigger.MONITOR_EVENT, item.id):
                run.trigger = {**run.trigger, "kind": str(Trigger.MONITOR_FINISHED)}
                u.save(run)
                u.emit("run.folded", run_view(run), thread_id=thread.id, run_id=run.id)

    def monitor_output(self, item_id: str, lines: list[str], offset: int) -> None:
        with self.unit() as u:
            item = u.need(Item, item_id, "background item")
            if item.is_running and lines:
                self._monitor_lines(u, item, lines, offset)

    def _monitor_lines(self, u: Unit, item: Item, lines: list[str], offset: int | None) -> None:
        if offset is not None:
            item.offset = offset
        item.last_line = lines[-1]
        u.save(item)
        u.emit("item.output", {**item_view(item), "lines": lines}, thread_id=item.thread_id)
        thread = u.need(Thread, item.thread_id, "thread")
        source = {"kind": Trigger.MONITOR_EVENT, "itemId": item.id, "label": item.label}
        message = self._message(u, thread, "notification", "\n".join(lines), source)
        self._queue(u, thread, Trigger.MONITOR_EVENT, [message], key=item.id)

    def schedule(self, caller: Caller, in_ms: int, text: str, hold: bool = False) -> dict[str, Any]:
        if in_ms < 0:
            raise Invalid("inMs must be zero or more")
        with self.unit() as u:
            thread = self._acting_thread(u, caller)
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
            return item_view(self._start_item(u, item, "timer.arm"))

    def schedule_due(self, item_id: str) -> None:
        with self.unit() as u:
            item = u.need(Item, item_id, "background item")
            if item.is_running:
                self._item_ended(u, item, ItemStatus.ENDED, None, None)

    def background_wait(self, caller: Caller, ref: str) -> dict[str, Any]:
        """Mark a background command awaited: the thread holds until it ends."""
        with self.unit() as u:
            thread = self._acting_thread(u, caller)
            item = self.find_item(u, thread, ref)
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
        with self.unit() as u:
            item = u.need(Item, item_id, "background item")
            thread = self.thread_for(u, caller, item.thread_id)
            stopped = item.is_running
            if item.is_running and item.kind == ItemKind.TASK:
                task = u.load(Task, item.task_id)
                if task is not None and task.is_open:
                    self._cancel(u, task, False, reason)
            elif item.is_running and item.kind == ItemKind.SCHEDULE:
                background.end(item, ItemStatus.CANCELLED, u.at, reason=reason)
                u.save(item)
                u.emit("item.ended", item_view(item), thread_id=thread.id)
                u.mark(thread.id)
            elif item.is_running:
                self._item_ended(u, item, ItemStatus.CANCELLED, None, reason)
                u.outbox("process.kill", {"itemId": item.id, **_on(item.member)}, item.thread_id)
            return {
                "itemId": item.id,
                "threadId": thread.id,
                "kind": item.kind,
                "status": item.status,
                "stopped": stopped,
            }

    @staticmethod
    def find_item(u: Unit, thread: Thread, ref: str) -> Item:
        item = u.load(Item, ref)
        if item is not None and item.thread_id == thread.id:
            return item
        for item in u.query(Item, thread_id=thread.id):
            if item.label == ref:
                return item
        raise NotFound(f"no background item {ref!r} in thread {thread.id}")

    # ------------------------------------------------------------------ remote children

    def delegate_remote(
        self,
        caller: Caller,
        environment_id: str,
        task: str,
        *,
        provider: str | None = None,
        mode: str = "async",
        hold: bool = True,
        title: str | None = None,
        client_request_id: str | None = None,
        model: str | None = None,
        deadline_ms: int | None = None,
        on_deadline: str | None = None,
    ) -> dict[str, Any]:
        """``delegate_task`` to a linked environment (origin side): the task and its held
        item are recorded here at once; the peer is asked to create the child by the link's
        pusher, from the durable ``remote_pending`` mark, until it answers."""
        if mode not in ("async", "wait"):
            raise Invalid(f"mode must be 'async' or 'wait', not {mode!r}")
        self._check_deadline(deadline_ms, on_deadline)

        def body(u: Unit) -> dict[str, Any]:
            parent = self._acting_thread(u, caller)
            if parent.token_id is not None:
                raise Forbidden("work started through a link cannot use this environment's links")
            record = Task(
                id=new_id("tsk"),
                parent_environment_id=self.environment_id,
                parent_thread_id=parent.id,
                child_environment_id=environment_id,
                child_thread_id="",
                created_at=u.at,
                title=title,
                mode=mode,
                hold=hold,
                waiting_call=mode == "wait",
                remote_pending="create",
                remote_request={"task": task, "provider": provider, "model": model},
            )
            deadlines.set_deadline(record, deadline_ms, on_deadline, self.default_deadline_ms)
            self._save_task(u, record, "task.created")
            self._task_item(u, record, hold)
            u.outbox("peer.push", {"environmentId": environment_id})
            return task_view(record)

        return self._once(caller, "delegate", client_request_id, body)

    def queue_send(
        self,
        caller: Caller,
        environment_id: str,
        thread_id: str,
        text: str,
        mode: str = "auto",
        client_request_id: str | None = None,
    ) -> Send:
        """``thread_send`` to a linked environment: kept here first, then pushed. The
        send's id is the idempotency key the peer sees, so retries deliver it once."""

        def body(u: Unit) -> dict[str, Any]:
            origin = self._origin(caller) or {"environmentId": self.environment_id}
            send = Send(new_id("snd"), environment_id, thread_id, text, u.at, mode, origin)
            u.save(send)
            u.outbox("peer.push", {"environmentId": environment_id})
            return {"sendId": send.id}

        key = f"send:{environment_id}:{thread_id}"
        send_id = self._once(caller, key, client_request_id, body)["sendId"]
        with self.unit() as u:
            return u.need(Send, send_id, "send")

    def send_done(self, send_id: str, result: dict[str, Any] | None = None, error: str | None = None) -> None:
        with self.unit() as u:
            send = u.need(Send, send_id, "send")
            if send.status == "pending":
                send.status, send.result, send.error = ("failed" if error else "sent"), result, error
                u.save(send)

    def remote_sent(
        self, task_id: str, child_thread_id: str | None = None, remote_task_id: str | None = None
    ) -> None:
        """The peer took the pending call; a created child's thread id (for an A2A agent:
        its context id, and its own id of the task) is now known."""
        with self.unit() as u:
            task = u.need(Task, task_id, "task")
            task.remote_pending = None
            if child_thread_id and not task.child_thread_id:
                task.child_thread_id = child_thread_id
            if remote_task_id and not task.remote_task_id:
                task.remote_task_id = remote_task_id
            self._save_task(u, task)

    def remote_refused(self, task_id: str, message: str) -> None:
        """The peer refused to create the child (bad input, fence): the task fails, and the
        parent is told as for any other ending."""
        with self.unit() as u:
            task = u.need(Task, task_id, "task")
            task.remote_pending = None
            if task.is_open:
                tasks.fail(task, u.at, message)
                self._save_task(u, task, "task.completed")
                self._task_ended(u, task)
            else:
                u.save(task)

    def apply_remote(self, environment_id: str, seq: int, view: dict[str, Any]) -> bool:
        """One task event from a peer's feed (see ``apply_remote_chunk``)."""
        return self.apply_remote_chunk(environment_id, [(seq, view)]) == 1

    def apply_remote_chunk(self, environment_id: str, events: list[tuple[int, dict[str, Any]]]) -> int:
        """Task events from a peer's feed, in feed order, each applied exactly once: the
        cursor moves in the same transaction, and a task already terminal here takes no
        more news (G3, G7). One transaction for a whole received chunk: results that arrive
        together fold into one wake, as local ones ending in one command do. Returns how
        many were new."""
        with self.unit() as u:
            link = u.load(Link, environment_id)
            if link is None:
                return 0
            applied = 0
            for seq, view in events:
                if link.cursor is not None and seq <= int(link.cursor):
                    continue
                link.cursor = str(seq)
                self._mirror(u, environment_id, view)
                applied += 1
            if applied:
                u.save(link)
            return applied

    def _mirror(self, u: Unit, environment_id: str, view: dict[str, Any]) -> None:
        task = u.load(Task, view.get("taskId"))
        if task is None:
            root = u.load(Task, view.get("followUpOf"))
            if root is None or root.child_environment_id != environment_id:
                return
            task = tasks.follow_up(root, view["taskId"], u.at)
            root.follow_ups.append(task.id)
            self._save_task(u, root)
            self._save_task(u, task, "task.created")
            self._task_item(u, task, hold=False)
        if task.child_environment_id != environment_id or task.parent_environment_id != self.environment_id:
            return
        self._mirror_into(u, task, view)

    def _mirror_into(self, u: Unit, task: Task, view: dict[str, Any]) -> None:
        if not task.is_open:
            # Ended here already: only later progress (a persistent monitor's lines after
            # the result) and whether its child still has work still belong to it (G4, G5).
            if tasks.mirror_progress(task, view) | tasks.mirror_child_active(task, view):
                self._save_task(u, task)
            return
        tasks.mirror(task, view)
        if task.is_open:
            self._save_task(u, task)
        else:
            self._save_task(u, task, "task.completed")
            self._task_ended(u, task)

    def apply_a2a(
        self, environment_id: str, remote_task_id: str, references: list[str], view: dict[str, Any]
    ) -> None:
        """A task of an A2A agent we delegated to, as it stands there (SPEC §14), applied to
        ours. A task we do not know yet that references one of ours (same context,
        ``referenceTaskIds``) is the agent's late answer: it becomes a follow-up, found again
        by its remote id on every later read, so it is opened — and wakes the parent — once."""
        with self.unit() as u:
            ours = [
                t
                for t in u.query(Task, child_thread_id=view["childThreadId"])
                if t.child_environment_id == environment_id
                and t.parent_environment_id == self.environment_id
                and t.remote_task_id
            ]
            known = {t.remote_task_id: t for t in ours}
            task = known.get(remote_task_id)
            if task is None:
                referenced = next((known[r] for r in references if r in known), None)
                root = referenced and u.load(Task, referenced.follow_up_of or referenced.id)
                if root is None or root.status == TaskStatus.CANCELLED:
                    return  # not an answer to us, or one the parent no longer wants
                task = tasks.follow_up(root, new_id("tsk"), u.at)
                task.remote_task_id = remote_task_id
                root.follow_ups.append(task.id)
                self._save_task(u, root)
                self._save_task(u, task, "task.created")
                self._task_item(u, task, hold=False)
            self._mirror_into(u, task, view)

    def add_link(
        self, environment_id: str, name: str, url: str, token: str, label: str | None, kind: str
    ) -> Link:
        """Link (or re-link) the environment or A2A agent ``environment_id``: adding it
        again with a new URL or token keeps its cursor, so nothing is applied twice."""
        with self.unit() as u:
            link = u.load(Link, environment_id)
            if link is None:
                link = Link(environment_id, name, url, token, u.at, label, kind=kind)
            else:
                link.name, link.url, link.token, link.label = name, url, token, label or link.label
            link.status, link.last_error = "ok", None
            u.save(link)
            u.emit("link.added", {"environmentId": environment_id, "name": name, "kind": link.kind})
            return link

    def link_status(self, environment_id: str, status: str, error: str | None) -> Link | None:
        """What the link's follower found: reachable, unreachable, revoked (and why)."""
        with self.unit() as u:
            link = u.load(Link, environment_id)
            if link is None or (link.status, link.last_error) == (status, error):
                return link
            link.status, link.last_error = status, error
            u.save(link)
            u.emit("link.status", {"environmentId": environment_id, "status": status, "lastError": error})
            return link

    def link_revoked(self, environment_id: str, message: str) -> int:
        """The peer refused our token. A child created with it can never be followed again
        (the peer shows a new token only what that token creates), so its task fails now and
        the parent is told — nothing waits forever. A delegation not yet handed over keeps
        waiting: a new link carries it."""
        with self.unit() as u:
            lost = [
                t
                for t in u.query(Task, status=list(OPEN_TASK), parent_environment_id=self.environment_id)
                if t.child_environment_id == environment_id and t.remote_pending != "create"
            ]
            for task in lost:
                task.remote_pending = None
                tasks.fail(task, u.at, message)
                self._save_task(u, task, "task.completed")
                self._task_ended(u, task)
            return len(lost)

    def accept_task(
        self,
        caller: Caller,
        task_id: str,
        text: str,
        *,
        origin: dict[str, Any],
        provider: str | None = None,
        title: str | None = None,
        hold: bool = True,
        mode: str = "async",
        model: str | None = None,
    ) -> dict[str, Any]:
        """Destination side of a remote delegation: the child thread, fenced to the link
        token, with the task under the origin's id. Idempotent on that id (G9)."""
        if caller.kind != "link":
            raise Forbidden("only a link token can hand this environment a task")
        self.check_origin(origin)

        def body(u: Unit) -> dict[str, Any]:
            existing = u.load(Task, task_id)
            if existing is not None:
                child = u.load(Thread, existing.child_thread_id)
                if child is None or not self.visible(u, caller, child):
                    raise Forbidden(f"task id {task_id!r} is not available to this token")
                raise Conflict(f"task {task_id!r} already exists")
            record = Task(
                id=task_id,
                parent_environment_id=origin["environmentId"],
                parent_thread_id=origin["threadId"],
                child_environment_id=self.environment_id,
                child_thread_id="",
                created_at=u.at,
                title=title,
                mode=mode,
                hold=hold,
            )
            chosen = provider or _default_provider(text, "script")
            self._child(u, record, text, chosen, caller.token_id, origin, model)
            return task_view(record)

        return self._once(caller, "accept_task", task_id, body)

    def a2a_message(
        self, caller: Caller, context_id: str, text: str, message_id: str, provider: str | None = None
    ) -> dict[str, Any]:
        """An A2A message (SPEC §14), one transaction, at most once per message id (G9).

        The A2A caller's context is the parent "thread" (in the pseudo-environment
        ``A2A_PARENT``). A new context gets a child thread and a task; an existing one gets
        the message in its child thread as from the parent (``thread_send``), so the
        follow-up rule of §1 applies. Answers the task the message is for: the open one,
        or the follow-up it opened."""
        origin = {"environmentId": A2A_PARENT, "threadId": context_id}

        def body(u: Unit) -> dict[str, Any]:
            roots = u.query(
                Task, parent_thread_id=context_id, parent_environment_id=A2A_PARENT, follow_up_of=None
            )
            if not roots:
                record = Task(
                    id=new_id("tsk"),
                    parent_environment_id=A2A_PARENT,
                    parent_thread_id=context_id,
                    child_environment_id=self.environment_id,
                    child_thread_id="",
                    created_at=u.at,
                )
                chosen = provider or _default_provider(text, "script")
                self._child(u, record, text, chosen, caller.token_id, origin)
                return task_view(record)
            child = self.thread_for(u, caller, self.task_for(u, caller, roots[0].id).child_thread_id)
            if child.cancelled:
                raise Conflict(f"the task of context {context_id!r} was cancelled: it takes no messages")
            self._follow_up_on_send(u, child)
            self._post(u, child, text, {"kind": Trigger.MESSAGE, "origin": origin}, Trigger.MESSAGE)
            return task_view(u.need(Task, child.open_task_id or "", "task"))

        return self._once(caller, "a2a_message", message_id, body)

    def a2a_push_configs(
        self, caller: Caller, task_id: str, put: dict[str, Any] | None = None, delete: str | None = None
    ) -> list[dict[str, Any]]:
        """The A2A push notification configs of a task's context (kept on its root task):
        add or replace ``put``, remove the one with id ``delete``, answer them all. A new
        config is pushed the task's current state at once, through the outbox."""
        with self.unit() as u:
            task = self.task_for(u, caller, task_id)
            if task.parent_environment_id != A2A_PARENT:
                raise NotFound(f"no A2A task with id {task_id!r}")
            root = u.need(Task, task.follow_up_of or task.id, "task")
            if delete is not None:
                if not any(config["id"] == delete for config in root.push):
                    raise NotFound(f"no push notification config {delete!r} for task {task_id}")
                root.push = [config for config in root.push if config["id"] != delete]
            if put is not None:
                root.push = [config for config in root.push if config["id"] != put["id"]] + [put]
            u.save(root)
            if put is not None:
                u.outbox("a2a.push", {"taskId": task.id, "configId": put["id"]}, task.child_thread_id)
            return list(root.push)

    def _a2a_push(self, u: Unit, task: Task) -> None:
        """Every change of an A2A task goes to its context's push configs (never dropped:
        outbox rows are retried with backoff and parked visibly, not deleted)."""
        root = task if task.follow_up_of is None else u.load(Task, task.follow_up_of)
        for config in root.push if root else []:
            u.outbox("a2a.push", {"taskId": task.id, "configId": config["id"]}, task.child_thread_id)

    # ------------------------------------------------------------------ restart (G6)

    # ------------------------------------------------------------------ side effects

    def effects_done(self, done: list[int], failed: list[tuple[OutboxRow, str, float | None]]) -> None:
        """Outbox rows were carried out (``done``: removed) or failed (kept, with their
        error, to retry at the given time — or parked when that time is None). A parked row
        stays visible to people and the API; what it was for fails visibly, so nothing
        waits on it forever (a turn that could not start fails its run, a process that could
        not be spawned ends its item as failed, which wakes the thread)."""
        with self.unit() as u:
            u.touched.add("effects")
            for row_id in done:
                u.tx.remove_outbox(row_id)
            for row, error, retry_at in failed:
                u.tx.fail_outbox(row.id, error, retry_at)
                if retry_at is None:
                    self._parked(u, row, error)

    def _parked(self, u: Unit, row: OutboxRow, error: str) -> None:
        view = {"id": row.id, "kind": row.kind, "attempts": row.attempts + 1, "lastError": error}
        u.emit("effect.parked", view, thread_id=row.thread_id)
        if row.kind == "run.execute":
            run = u.load(Run, row.payload["runId"])
            if run is not None and run.status == RunStatus.RUNNING:
                self._end_run(u, run, RunStatus.FAILED, None, f"could not start the turn: {error}")
        elif row.kind == "process.start":
            item = u.load(Item, row.payload["itemId"])
            if item is not None and item.is_running:
                self._item_ended(u, item, ItemStatus.FAILED, None, f"could not start: {error}")

    def recover(
        self, exited: dict[str, int | None], lost: list[str], member: str | None = None
    ) -> list[str]:
        """Start-up, one transaction: running runs → interrupted, one ``restart`` run per
        thread; processes that ended while we were down are reported as usual
        (``exited``: their recorded exit codes), vanished ones by the ``restart`` run;
        a wait-mode call that died hands its result to a completion wake instead.

        With ``member``, only that process's runs: on a store several processes serve,
        a process recovers its own at start, and the survivors recover one gone for good
        (SPEC §12). Recovering twice changes nothing the second time."""
        with self.unit() as u:
            restarted: list[str] = []
            for run in u.query(Run, status=RunStatus.RUNNING):
                if member is not None and run.member != member:
                    continue
                self._end_run(u, run, RunStatus.INTERRUPTED, run.reply, "tether restarted during this run")
                thread = u.need(Thread, run.thread_id, "thread")
                text = f"tether restarted while run {run.id} was active; that run was interrupted."
                message = self._message(u, thread, "notification", text, {"kind": Trigger.RESTART})
                self._queue(u, thread, Trigger.RESTART, [message])
                restarted.append(thread.id)
                for task in u.query(Task, parent_thread_id=thread.id):
                    self._release_waiting_call(u, task)
            for item_id, code in exited.items():
                item = u.need(Item, item_id, "background item")
                if item.is_running:
                    self._item_ended(u, item, ItemStatus.ENDED, code, None)
            for item_id in lost:
                item = u.need(Item, item_id, "background item")
                if item.is_running:
                    self._item_ended(
                        u,
                        item,
                        ItemStatus.FAILED,
                        None,
                        "lost: its process was gone after a restart",
                        trigger=Trigger.RESTART,
                    )
            return restarted

    def _release_waiting_call(self, u: Unit, task: Task) -> None:
        if not task.waiting_call:
            return
        task.waiting_call = False
        if tasks.release_claim(task):
            parent = u.load(Thread, task.parent_thread_id)
            if parent is not None:
                self._wake(u, parent, task)
                return
        u.save(task)


def _on(member: str | None) -> dict[str, str]:
    """An outbox payload's ``member``: the process that alone can carry the row out (stop
    its own turn, kill its own process); none when any process can (SPEC §12)."""
    return {"member": member} if member else {}


def _default_provider(task: str, parent_provider: str) -> str:
    """A script object (JSON with ``tether_script``) runs on the script provider."""
    try:
        parsed = json.loads(task)
    except ValueError:
        return parent_provider
    return "script" if isinstance(parsed, dict) and "tether_script" in parsed else parent_provider
