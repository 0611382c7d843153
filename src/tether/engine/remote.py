"""Remote children, origin side: what a linked environment or an A2A agent reports about
the tasks delegated to it is mirrored onto ours, and our sends and calls to it are kept
until it took them. Also the A2A serving side's commands (SPEC §14).

The destination owns the settle decision; the origin mirrors the task's status and result
from the peer's feed and delivers the wake locally, through the same kernel (G5). Events
are applied in the transaction that moves the link's cursor, so each once (G3, G7).
"""

from __future__ import annotations

from typing import Any

from tether.domain import tasks
from tether.domain.records import Link, Send, Task
from tether.domain.types import OPEN_TASK, TaskStatus, Trigger
from tether.domain.views import task_view
from tether.engine import access
from tether.engine.delegation import Delegation
from tether.engine.kernel import follow_up_on_send, task_ended
from tether.engine.unit import Unit
from tether.engine.units import Units
from tether.engine.writes import A2A_PARENT, post, save_task, task_item
from tether.errors import Conflict, NotFound
from tether.ids import new_id
from tether.types import Caller


class Remote:
    """The commands that mirror remote children and keep what we owe a peer."""

    def __init__(self, units: Units, delegation: Delegation) -> None:
        self.units = units
        self.delegation = delegation

    # ------------------------------------------------------------------ what we send

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
        here = self.units.environment_id

        def body(u: Unit) -> dict[str, Any]:
            origin = access.origin(caller, here) or {"environmentId": here}
            send = Send(new_id("snd"), environment_id, thread_id, text, u.at, mode, origin)
            u.save(send)
            u.outbox("peer.push", {"environmentId": environment_id})
            return {"sendId": send.id}

        key = f"send:{environment_id}:{thread_id}"
        send_id = self.units.once(caller, key, client_request_id, body)["sendId"]
        with self.units.unit() as u:
            return u.need(Send, send_id, "send")

    def send_done(self, send_id: str, result: dict[str, Any] | None = None, error: str | None = None) -> None:
        with self.units.unit() as u:
            send = u.need(Send, send_id, "send")
            if send.status == "pending":
                send.status, send.result, send.error = ("failed" if error else "sent"), result, error
                u.save(send)

    def remote_sent(
        self,
        task_id: str,
        child_thread_id: str | None = None,
        remote_task_id: str | None = None,
        call: str = "create",
    ) -> None:
        """The peer took the pending ``call`` ("create" or "cancel"); a created child's
        thread id (for an A2A agent: its context id, and its own id of the task) is now
        known. Only that call stops being pending: a cancel decided while the create was on
        its way is still to send. Deferred (``later``): it goes with the next command, and
        the pusher's next look at what is pending (a ``view``) flushes it first. A crash
        before that pushes the call again, which the peer answers as already done (409 for a
        create; a cancel is idempotent)."""

        def write(u: Unit) -> None:
            task = u.load(Task, task_id)
            if task is None:
                return
            if task.remote_pending == call:
                task.remote_pending = None
            if child_thread_id and not task.child_thread_id:
                task.child_thread_id = child_thread_id
            if remote_task_id and not task.remote_task_id:
                task.remote_task_id = remote_task_id
            save_task(u, task)

        self.units.later(write)

    def remote_refused(self, task_id: str, message: str) -> None:
        """The peer refused to create the child (bad input, fence): the task fails, and the
        parent is told as for any other ending."""
        with self.units.unit() as u:
            task = u.need(Task, task_id, "task")
            task.remote_pending = None
            if task.is_open:
                _fail(u, task, message)
            else:
                u.save(task)

    # ------------------------------------------------------------------ the links themselves

    def add_link(
        self, environment_id: str, name: str, url: str, token: str, label: str | None, kind: str
    ) -> Link:
        """Link (or re-link) the environment or A2A agent ``environment_id``: adding it
        again with a new URL or token keeps its cursor, so nothing is applied twice."""
        with self.units.unit() as u:
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
        with self.units.unit() as u:
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
        with self.units.unit() as u:
            lost = [
                t
                for t in u.query(Task, status=list(OPEN_TASK), parent_environment_id=u.environment_id)
                if t.child_environment_id == environment_id and t.remote_pending != "create"
            ]
            for task in lost:
                task.remote_pending = None
                _fail(u, task, message)
            return len(lost)

    # ------------------------------------------------------------------ what we hear

    def apply_remote(self, environment_id: str, seq: int, view: dict[str, Any]) -> bool:
        """One task event from a peer's feed (see ``apply_remote_chunk``)."""
        return self.apply_remote_chunk(environment_id, [(seq, view)]) == 1

    def apply_remote_chunk(self, environment_id: str, events: list[tuple[int, dict[str, Any]]]) -> int:
        """Task events from a peer's feed, in feed order, each applied exactly once: the
        cursor moves in the same transaction, and a task already terminal here takes no
        more news (G3, G7). One transaction for a whole received chunk: results that arrive
        together fold into one wake, as local ones ending in one command do. Returns how
        many were new."""
        with self.units.unit() as u:
            link = u.load(Link, environment_id)
            if link is None:
                return 0
            applied = 0
            for seq, view in events:
                if link.cursor is not None and seq <= int(link.cursor):
                    continue
                link.cursor = str(seq)
                _mirror(u, environment_id, view)
                applied += 1
            if applied:
                u.save(link)
            return applied

    def apply_a2a(
        self, environment_id: str, remote_task_id: str, references: list[str], view: dict[str, Any]
    ) -> None:
        """A task of an A2A agent we delegated to, as it stands there (SPEC §14), applied to
        ours. A task we do not know yet that references one of ours (same context,
        ``referenceTaskIds``) is the agent's late answer: it becomes a follow-up, found again
        by its remote id on every later read, so it is opened — and wakes the parent — once."""
        with self.units.unit() as u:
            ours = [
                t
                for t in u.query(Task, child_thread_id=view["childThreadId"])
                if t.child_environment_id == environment_id
                and t.parent_environment_id == u.environment_id
                and t.remote_task_id
            ]
            known = {t.remote_task_id: t for t in ours}
            task = known.get(remote_task_id)
            if task is None:
                referenced = next((known[r] for r in references if r in known), None)
                root = referenced and u.load(Task, referenced.follow_up_of or referenced.id)
                if root is None or root.status == TaskStatus.CANCELLED:
                    return  # not an answer to us, or one the parent no longer wants
                task = _remote_follow_up(u, root, new_id("tsk"), remote_task_id)
            _mirror_into(u, task, view)

    # ------------------------------------------------------------------ A2A clients of ours

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
                    child_environment_id=u.environment_id,
                    child_thread_id="",
                    created_at=u.at,
                )
                chosen = provider or tasks.default_provider(text, "script")
                self.delegation.open_child(u, record, text, chosen, caller.token_id, origin)
                return task_view(record)
            root = access.task_for(u, caller, roots[0].id)
            child = access.thread_for(u, caller, root.child_thread_id)
            if child.cancelled:
                raise Conflict(f"the task of context {context_id!r} was cancelled: it takes no messages")
            follow_up_on_send(u, child)
            post(u, child, text, {"kind": Trigger.MESSAGE, "origin": origin}, Trigger.MESSAGE)
            return task_view(u.need(Task, child.open_task_id or "", "task"))

        return self.units.once(caller, "a2a_message", message_id, body)

    def a2a_push_configs(
        self, caller: Caller, task_id: str, put: dict[str, Any] | None = None, delete: str | None = None
    ) -> list[dict[str, Any]]:
        """The A2A push notification configs of a task's context (kept on its root task):
        add or replace ``put``, remove the one with id ``delete``, answer them all. A new
        config is pushed the task's current state at once, through the outbox."""
        with self.units.unit() as u:
            task = access.task_for(u, caller, task_id)
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


def _fail(u: Unit, task: Task, message: str) -> None:
    """A remote child that can never answer: its task fails, and the parent is told."""
    tasks.fail(task, u.at, message)
    save_task(u, task, "task.completed")
    task_ended(u, task)


def _remote_follow_up(u: Unit, root: Task, task_id: str, remote_task_id: str | None = None) -> Task:
    """A follow-up a remote child opened (its answer after the task ended), recorded here."""
    task = tasks.follow_up(root, task_id, u.at)
    task.remote_task_id = remote_task_id
    root.follow_ups.append(task.id)
    save_task(u, root)
    save_task(u, task, "task.created")
    task_item(u, task, hold=False)
    return task


def _mirror(u: Unit, environment_id: str, view: dict[str, Any]) -> None:
    task = u.load(Task, view.get("taskId"))
    if task is None:
        root = u.load(Task, view.get("followUpOf"))
        if root is None or root.child_environment_id != environment_id:
            return
        task = _remote_follow_up(u, root, view["taskId"])
    if task.child_environment_id != environment_id or task.parent_environment_id != u.environment_id:
        return
    _mirror_into(u, task, view)


def _mirror_into(u: Unit, task: Task, view: dict[str, Any]) -> None:
    if not task.is_open:
        # Ended here already: only later progress (a persistent monitor's lines after
        # the result) and whether its child still has work still belong to it (G4, G5).
        if tasks.mirror_progress(task, view) | tasks.mirror_child_active(task, view):
            save_task(u, task)
        return
    tasks.mirror(task, view)
    if task.is_open:
        save_task(u, task)
    else:
        save_task(u, task, "task.completed")
        task_ended(u, task)
