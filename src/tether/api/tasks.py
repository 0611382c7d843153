"""``/api/tasks``: list, read and cancel delegated tasks (follow-ups included)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends

from tether.api.auth import caller, environment_dependency
from tether.api.models import CancelTask
from tether.environment import Environment
from tether.types import Caller

router = APIRouter(prefix="/api/tasks", tags=["tasks"])
Who = Annotated[Caller, Depends(caller)]
Env = Annotated[Environment, Depends(environment_dependency)]
Status = Literal["queued", "running", "completed", "failed", "cancelled", "interrupted"]


@router.get("")
async def list_tasks(
    who: Who, env: Env, parentThreadId: str | None = None, status: Status | None = None
) -> dict[str, Any]:
    return {"tasks": env.queries.tasks(who, parentThreadId, status)}


@router.get("/{task_id}")
async def get_task(task_id: str, who: Who, env: Env) -> dict[str, Any]:
    return env.queries.task(who, task_id)


@router.post("/{task_id}/cancel")
async def cancel_task(task_id: str, who: Who, env: Env, body: CancelTask | None = None) -> dict[str, Any]:
    return await env.tools.task_cancel(who, task_id, body.reason if body else None)
