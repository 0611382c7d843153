"""Commands: every change to tether is one of these, applied in order, in one transaction.

Each command opens a unit (:mod:`tether.engine.units`), changes records through the pure
domain rules, appends events and outbox rows, then — still inside the transaction — runs
the reconcile kernel (:mod:`tether.engine.kernel`) over every thread it touched: start
the next run, recompute settled, turn a settled child's reply into its task's result,
queue the parent's wake. Only then does it commit. So a child's answer and its parent's
wake, or a background item's end and its wake run (G2), become visible together or not
at all.

:class:`Commands` is the façade every caller holds. The thread and run commands are
here; the others live beside it by concept and are exposed under the same names:
:mod:`~tether.engine.delegation` (tasks, deadlines), :mod:`~tether.engine.background`
(commands, monitors, schedules), :mod:`~tether.engine.remote` (linked environments and
A2A), :mod:`~tether.engine.recovery` (restarts, parked side effects). Access (G10) is
:mod:`~tether.engine.access`, shared with the queries.

Side effects (start a provider turn, spawn or kill a process, arm a timer, call a peer)
are outbox rows; :mod:`tether.engine.runtime` carries them out after the commit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tether.domain import access as rules
from tether.domain import runs
from tether.domain.records import Run, Thread
from tether.domain.types import ACTIVE_RUN, RunStatus, Trigger
from tether.engine import access, kernel
from tether.engine.background import Background
from tether.engine.delegation import Delegation
from tether.engine.recovery import Recovery
from tether.engine.remote import Remote
from tether.engine.unit import Unit, View
from tether.engine.units import Deferred, Units
from tether.engine.writes import A2A_PARENT, message, new_thread, post
from tether.errors import Invalid, NotFound
from tether.ids import now
from tether.store.base import Store
from tether.types import Caller

__all__ = ["A2A_PARENT", "Commands"]


class Commands(Units):
    def __init__(
        self,
        store: Store,
        environment_id: str,
        providers: Mapping[str, Any] | Iterable[str] = ("script",),
        on_commit: Callable[[set[str]], None] | None = None,
    ) -> None:
        super().__init__(store, environment_id, providers, on_commit)
        self.delegation = Delegation(self)
        self.background = Background(self)
        self.remote = Remote(self, self.delegation)
        self.recovery = Recovery(self)
        # The commands of each concept, under the names callers use.
        self.delegate = self.delegation.delegate
        self.delegate_remote = self.delegation.delegate_remote
        self.accept_task = self.delegation.accept_task
        self.accept_tasks = self.delegation.accept_tasks
        self.end_wait = self.delegation.end_wait
        self.deadline_due = self.delegation.deadline_due
        self.start_process = self.background.start_process
        self.process_spawned = self.background.process_spawned
        self.process_ended = self.background.process_ended
        self.monitor_output = self.background.monitor_output
        self.schedule = self.background.schedule
        self.schedule_due = self.background.schedule_due
        self.background_wait = self.background.background_wait
        self.stop_item = self.background.stop_item
        self.queue_send = self.remote.queue_send
        self.send_done = self.remote.send_done
        self.remote_sent = self.remote.remote_sent
        self.remote_refused = self.remote.remote_refused
        self.link_revoked = self.remote.link_revoked
        self.add_link = self.remote.add_link
        self.link_status = self.remote.link_status
        self.apply_remote = self.remote.apply_remote
        self.apply_remote_chunk = self.remote.apply_remote_chunk
        self.apply_a2a = self.remote.apply_a2a
        self.a2a_message = self.remote.a2a_message
        self.a2a_push_configs = self.remote.a2a_push_configs
        self.effects_done = self.recovery.effects_done
        self.effects_done_soon = self.recovery.effects_done_soon
        self.recover = self.recovery.recover

    # Access (G10): the fence, as callers outside the engine reach it.
    visible = staticmethod(access.visible)
    thread_for = staticmethod(access.thread_for)
    task_for = staticmethod(access.task_for)

    def check_origin(self, origin: dict[str, Any]) -> None:
        access.check_origin(origin, self.environment_id)

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
            thread = new_thread(u, provider, title, token_id=caller.token_id, model=model)
            run_id = None
            if message is not None:
                source = {"kind": Trigger.USER}
                run_id = post(u, thread, message, source, Trigger.USER).id
            return {"threadId": thread.id, "runId": run_id}

        return self.once(caller, "create_thread", client_request_id, body)

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
            thread = access.thread_for(u, caller, thread_id)
            origin = access.origin(caller, self.environment_id)
            if origin is not None:
                source = {"kind": Trigger.MESSAGE, "origin": origin}
                kind = Trigger.MESSAGE
            else:
                source, kind = {"kind": Trigger.USER}, Trigger.USER
            if origin and rules.is_parent(thread, origin) and thread.root_task_id:
                kernel.follow_up_on_send(u, thread)
            stopped = kernel.supersede(u, thread) if mode == "now" else []
            busy = bool(u.query(Run, thread_id=thread.id, status=list(ACTIVE_RUN)))
            run = post(u, thread, text, source, kind, first=mode == "now")
            answer = {"messageId": run.trigger["messageIds"][-1], "runId": run.id}
            answer["delivery"] = "queued" if busy and mode != "now" else "started"
            return answer | ({"stoppedRuns": stopped} if mode == "now" else {})

        return self.once(caller, f"post_message:{thread_id}", client_request_id, body)

    def cancel_task(self, caller: Caller, task_id: str, reason: str | None = None) -> dict[str, Any]:
        with self.unit() as u:
            task = access.task_for(u, caller, task_id)
            if task.is_open:
                by_parent = caller.thread_id == task.parent_thread_id
                kernel.cancel(u, task, by_parent, reason)
            return {"taskId": task.id, "status": task.status}

    def interrupt(self, caller: Caller, thread_id: str, stop: bool = False) -> dict[str, Any]:
        """``thread_interrupt``: stop the running run; with ``stop``, also the queued runs and
        all background work. The child's task then ends ``interrupted``."""
        with self.unit() as u:
            thread = access.thread_for(u, caller, thread_id)
            return kernel.stop(u, thread, "interrupted", RunStatus.INTERRUPTED, stop_all=stop)

    # ------------------------------------------------------------------ runs

    def end_run(self, run_id: str, status: str, reply: str | None = None, error: str | None = None) -> None:
        with self.unit() as u:
            run = u.need(Run, run_id, "run")
            if run.status != RunStatus.RUNNING:
                return  # already ended by a cancel or an interrupt
            kernel.end_run(u, run, status, reply, error)

    def begin_turn(self, run_id: str, member: str | None = None) -> bool:
        """The provider turn begins now, in process ``member``: that moment becomes the
        run's ``startedAt`` (dispatch set a first one). False when the run ended meanwhile or
        another process runs it. Alone on its store the write is deferred (``claim``)."""
        at = now()

        def write(u: Unit) -> bool:
            run = u.load(Run, run_id)
            if run is None or run.status != RunStatus.RUNNING or run.member not in (None, member):
                return False
            run.started_at, run.member = at, member
            u.save(run)
            return True

        return self.claim(write)

    def say(self, caller: Caller, text: str) -> None:
        """An assistant message written during the caller's run (deferred, ``later``)."""

        def write(u: Unit) -> None:
            thread = _turn_thread(u, caller)
            if thread is not None:
                message(u, thread, "assistant", text, run_id=caller.run_id)

        self._turn_write(caller, write)

    def set_state(self, caller: Caller, state: dict[str, Any]) -> None:
        """Replace a thread's provider state (the script's fired rules and action ids);
        deferred (``later``)."""

        def write(u: Unit) -> None:
            thread = _turn_thread(u, caller)
            if thread is not None:
                thread.state = state
                u.save(thread)

        self._turn_write(caller, write)

    def _turn_write(self, caller: Caller, write: Deferred) -> None:
        """Refuse a write of an ended run at once (a snapshot read, no write lock), else
        defer it. Deferred writes never end runs, so the snapshot needs no flush."""
        with self.store.read() as reader:
            u = View(reader, self.environment_id)
            run = access.run_guard(u, caller.run_id)
            # A run's thread exists (records are never deleted); else count, not decode, it.
            known = run is not None and run.thread_id == caller.thread_id
            if not known and not u.count(Thread, id=caller.thread_id or ""):
                raise NotFound(f"no thread with id {caller.thread_id!r}")
        self.later(write)


def _turn_thread(u: Unit, caller: Caller) -> Thread | None:
    """The caller's thread, if its run still runs (checked again when applied)."""
    run = u.load(Run, caller.run_id)
    if run is not None and run.status != RunStatus.RUNNING:
        return None
    return u.load(Thread, caller.thread_id)
