"""Access (G10), shared by commands and queries: load what a caller names, through the fence.

The decisions are :mod:`tether.domain.access`; this module loads the records they need
from a unit or a view and turns a refusal into the error the caller sees (a thread or
task the caller may not see does not exist for it: 404, never 403).
"""

from __future__ import annotations

from typing import Any

from tether.domain import access
from tether.domain.records import Run, Task, Thread
from tether.domain.types import RunStatus
from tether.engine.unit import View
from tether.errors import Conflict, Forbidden, Invalid, NotFound
from tether.types import Caller


def visible(u: View, caller: Caller, thread: Thread) -> bool:
    """Whether ``caller`` may see ``thread`` (its own thread is loaded once per unit)."""
    return access.sees(caller, thread, u.load(Thread, caller.thread_id), u.environment_id)


def thread_for(u: View, caller: Caller, thread_id: str) -> Thread:
    thread = u.load(Thread, thread_id)
    if thread is None or not visible(u, caller, thread):
        raise NotFound(f"no thread with id {thread_id!r}")
    return thread


def task_for(u: View, caller: Caller, task_id: str) -> Task:
    """A task the caller may see, by its id — or, for a thread, by the label it gave a task
    it delegated (the latest, if it gave one label twice)."""
    task = u.load(Task, task_id)
    if task is None and caller.thread_id is not None:
        labelled = u.query(Task, parent_thread_id=caller.thread_id, label=task_id)
        task = labelled[-1] if labelled else None
    if task is not None:
        for thread_id in (task.child_thread_id, task.parent_thread_id):
            local = access.local_side(task, thread_id, u.environment_id)
            thread = u.load(Thread, thread_id) if local else None
            if thread is not None and visible(u, caller, thread):
                return task
    raise NotFound(f"no task with id {task_id!r}")


def run_guard(u: View, run_id: str | None) -> Run | None:
    """Tools called from a run act only while it runs: a cancelled run's late actions
    must change nothing."""
    run = u.load(Run, run_id)
    if run is not None and run.status != RunStatus.RUNNING:
        raise Conflict(f"run {run.id} has ended ({run.status})", code="run_ended")
    return run


def acting_thread(u: View, caller: Caller) -> Thread:
    """The thread a tool call acts for (its parent, for delegation), while its run runs."""
    if caller.thread_id is None:
        raise Invalid("delegate_task must be called as a thread (a run or a thread credential)")
    run_guard(u, caller.run_id)
    return u.need(Thread, caller.thread_id, "thread")


def check_origin(origin: dict[str, Any], environment_id: str) -> None:
    """A link call's origin names the *caller's* environment and thread. It is trusted
    only inside the token's fence (SPEC §1), so it may never name this environment:
    that would make a local thread the token did not create a parent, and wake it."""
    if not origin.get("environmentId") or not origin.get("threadId"):
        raise Invalid("origin needs environmentId and threadId")
    if origin["environmentId"] == environment_id:
        raise Forbidden("a link call's origin cannot be this environment")


def origin(caller: Caller, environment_id: str) -> dict[str, Any] | None:
    """Who a message comes from: a link call's origin, a thread of ours, or nobody (a
    person or an API client)."""
    if caller.origin:
        check_origin(caller.origin, environment_id)
        return caller.origin
    if caller.kind == "thread":
        return {"environmentId": environment_id, "threadId": caller.thread_id}
    return None
