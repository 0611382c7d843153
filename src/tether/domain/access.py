"""Who may see what (G10), decided over records: the engine loads them, this decides.

A token reaches only what it created; a thread sees itself, the children its tasks
created and its own parent — never its neighbours. ``environment_id`` is always the
environment deciding: a parent or a side of a task elsewhere is never "ours".
"""

from __future__ import annotations

from typing import Any

from tether.domain.records import Task, Thread
from tether.types import Caller


def parent_of(thread: Thread, environment_id: str) -> str | None:
    """The id of ``thread``'s parent thread, when that parent lives in this environment."""
    parent = thread.parent or {}
    return parent.get("threadId") if parent.get("environmentId") == environment_id else None


def sees(caller: Caller, thread: Thread, own: Thread | None, environment_id: str) -> bool:
    """Whether ``caller`` may see ``thread``; ``own`` is a thread caller's own thread."""
    if caller.kind == "admin":
        return True
    if caller.kind == "link":
        return thread.token_id == caller.token_id
    if thread.id == caller.thread_id or parent_of(thread, environment_id) == caller.thread_id:
        return True
    return own is not None and parent_of(own, environment_id) == thread.id


def local_side(task: Task, thread_id: str, environment_id: str) -> bool:
    """Whether the side of ``task`` that ``thread_id`` is (child or parent) lives here."""
    if thread_id == task.child_thread_id:
        return task.child_environment_id == environment_id
    return task.parent_environment_id == environment_id


def is_parent(thread: Thread, origin: dict[str, Any]) -> bool:
    """Whether ``origin`` (``{environmentId, threadId}``) names ``thread``'s parent."""
    parent = thread.parent or {}
    return parent.get("threadId") == origin.get("threadId") and parent.get("environmentId") == origin.get(
        "environmentId"
    )
