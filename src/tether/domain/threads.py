"""When is a thread settled, and what is it doing? (SPEC §1 "Settled").

These are the only definitions: the API, the task rules and the web page all call them,
so no two views of a thread can disagree.
"""

from __future__ import annotations

from collections.abc import Iterable

from tether.domain.records import Item, Run
from tether.domain.types import WorkState


def is_settled(active_runs: Iterable[Run], items: Iterable[Item]) -> bool:
    """Settled: no queued or running run but progress runs, and no held background work.

    The third clause of the SPEC ("no ended background item whose wake run is not yet
    queued") holds by construction: an item's end and its wake run are written in one
    transaction (G2), so there is never such an item to see.
    """
    if any(run.is_active and not run.is_progress for run in active_runs):
        return False
    return not any(item.held for item in items)


def work_state(active_runs: Iterable[Run], items: Iterable[Item]) -> WorkState:
    runs = list(active_runs)
    if any(run.is_active and not run.is_progress for run in runs):
        return WorkState.WORKING
    if any(item.held for item in items):
        return WorkState.WAITING_BACKGROUND
    return WorkState.RESULT_AVAILABLE


def status(active_runs: Iterable[Run]) -> str:
    return "running" if any(run.is_active for run in active_runs) else "idle"
