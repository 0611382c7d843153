"""What a thread needs from a person (SPEC §10): the one classification the web page groups
threads by and the JSON API shows as ``attention``.

Built on :func:`tether.domain.threads.work_state`, so the page and the API can never
disagree with the rules that decide *settled*:

- ``working`` — a run is queued or running;
- ``waiting`` — idle, but something will still wake it: held background work (the
  definition of *settled*), and also background work that is not held (a command nobody
  awaits, a persistent monitor, a schedule without ``hold``), a task it delegated that is
  still open, or an ended task whose child still has work that will wake it (its answer
  will come as a follow-up): each of these starts a run when it ends;
- ``failed`` — nothing will wake it and its last run failed;
- ``needs_input`` — nothing will wake it and only a person can move it on: a thread a
  person started that never ran, or whose last run a person stopped;
- ``settled`` — nothing will wake it, and it finished.

A thread is never ``settled`` here while something will still wake it. Pure functions, no
I/O: the records in, a word out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tether.domain.records import Item, Run, Task, Thread
from tether.domain.threads import work_state
from tether.domain.types import RunStatus, WorkState

NEEDS_INPUT = "needs_input"
WORKING = "working"
WAITING = "waiting"
FAILED = "failed"
SETTLED = "settled"

#: The order in which the page lists the groups: what needs a person first.
ORDER = (NEEDS_INPUT, WORKING, WAITING, FAILED, SETTLED)

_STOPPED = frozenset({RunStatus.INTERRUPTED, RunStatus.CANCELLED})


def last_answer_run(runs: Iterable[Run]) -> Run | None:
    """The thread's last non-progress run (by position), whatever its status."""
    found = None
    for run in runs:
        if not run.is_progress and (found is None or run.seq > found.seq):
            found = run
    return found


def will_answer(task: Task) -> bool:
    """The task's parent will still hear from it: it is open, or its child still has work
    that will wake it (a follow-up may come)."""
    return task.is_open or task.child_active


def attention(
    thread: Thread,
    active_runs: Iterable[Run],
    items: Iterable[Item],
    open_tasks: Iterable[Task],
    last_run: Run | None,
) -> str:
    """``needs_input | working | waiting | failed | settled`` (see the module docstring).

    ``active_runs``: the thread's queued and running runs (others are ignored);
    ``items``: its background items (ended ones are ignored); ``open_tasks``: the tasks it
    delegated (only open ones, and ended ones whose child is still active, count);
    ``last_run``: its last non-progress run, if any.
    """
    active = [run for run in active_runs if run.is_active]
    running = [item for item in items if item.is_running]
    if active:
        # A progress run is work too, though it never keeps a thread unsettled.
        return WORKING
    if work_state(active, running) == WorkState.WAITING_BACKGROUND:
        return WAITING
    if running or any(will_answer(task) for task in open_tasks):
        return WAITING  # not held, but its end still wakes the thread
    if thread.cancelled:
        return SETTLED
    top_level = thread.parent is None
    if last_run is None:
        return NEEDS_INPUT if top_level else SETTLED
    if last_run.status == RunStatus.FAILED:
        return FAILED
    if last_run.status in _STOPPED and top_level:
        return NEEDS_INPUT
    return SETTLED


def since(
    state: str, thread: Thread, active_runs: Iterable[Run], items: Iterable[Item], last_run: Run | None
) -> str:
    """Since when the thread has been in ``state`` (ISO time), for the elapsed time shown
    on working and waiting threads: the active run's start (or queueing), or the end of the
    last run (or the start of the oldest pending work)."""
    active = [run for run in active_runs if run.is_active]
    if state == WORKING and active:
        first = min(active, key=lambda r: r.seq)
        return first.started_at or first.queued_at
    if last_run is not None and last_run.ended_at:
        return last_run.ended_at
    running = sorted(item.started_at for item in items if item.is_running)
    return running[0] if running else thread.created_at


def summary(
    thread: Thread, runs: Iterable[Run], items: Iterable[Item], tasks: Iterable[Task]
) -> dict[str, Any]:
    """``{attention, attentionSince}`` from all of a thread's runs, items and the tasks it
    delegated: the fields the API adds to a thread view."""
    runs = list(runs)
    items = list(items)
    active = [run for run in runs if run.is_active]
    last = last_answer_run(runs)
    state = attention(thread, active, items, [t for t in tasks if will_answer(t)], last)
    return {"attention": state, "attentionSince": since(state, thread, active, items, last)}
