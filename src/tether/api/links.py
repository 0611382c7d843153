"""Linking (SPEC §6): link tokens we mint for peers, links we hold to peers, and the
endpoint through which a peer hands us a task."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import Field

from tether.api.auth import caller, environment_dependency
from tether.api.models import LinkRequest, LinkTokenRequest, _Body
from tether.engine.delegation import Handover
from tether.engine.tokens import token_view
from tether.environment import Environment
from tether.errors import Forbidden, TetherError
from tether.types import Caller

router = APIRouter(tags=["links"])
Who = Annotated[Caller, Depends(caller)]
Env = Annotated[Environment, Depends(environment_dependency)]


def _admin(who: Caller) -> None:
    if who.kind != "admin":
        raise Forbidden("this needs the admin token")


class AcceptTask(_Body):
    taskId: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_\-]+$")
    task: str = Field(min_length=1)
    origin: dict[str, Any]
    provider: str | None = Field(default=None, max_length=100)
    model: str | None = Field(default=None, max_length=200)
    title: str | None = Field(default=None, max_length=500)
    hold: bool = True
    mode: str = Field(default="async", pattern="^(async|wait)$")


@router.post("/api/link-tokens", status_code=201)
async def create_link_token(body: LinkTokenRequest, who: Who, env: Env) -> dict[str, Any]:
    _admin(who)
    record, token = env.tokens.mint(body.label)
    return {"tokenId": record.id, "token": token, "label": record.label, "createdAt": record.created_at}


@router.get("/api/link-tokens")
async def list_link_tokens(who: Who, env: Env) -> dict[str, Any]:
    _admin(who)
    return {"tokens": [token_view(t) for t in env.tokens.list()]}


@router.delete("/api/link-tokens/{token_id}")
async def revoke_link_token(token_id: str, who: Who, env: Env) -> dict[str, Any]:
    _admin(who)
    record = env.tokens.revoke(token_id)
    return {"tokenId": record.id, "revoked": True}


@router.post("/api/links", status_code=201)
async def add_link(body: LinkRequest, who: Who, env: Env) -> dict[str, Any]:
    _admin(who)
    return await env.peers.add(body.url, body.token, body.label, body.insecure, body.kind)


@router.get("/api/links")
async def list_links(who: Who, env: Env) -> dict[str, Any]:
    _admin(who)
    return {"links": env.peers.list()}


#: Tasks one ``POST /api/tasks/batch`` may carry.
BATCH_MAX = 50


class AcceptTasks(_Body):
    tasks: list[AcceptTask] = Field(min_length=1, max_length=BATCH_MAX)


@router.post("/api/tasks", status_code=201, tags=["tasks"])
async def accept_task(body: AcceptTask, who: Who, env: Env) -> dict[str, Any]:
    """A linked environment hands us a task: we create its child thread here."""
    return env.commands.accept_task(who, _handover(body))


@router.post("/api/tasks/batch", tags=["tasks"])
async def accept_tasks(body: AcceptTasks, who: Who, env: Env) -> dict[str, Any]:
    """Several tasks handed over in one request (an origin pushing many at once): each is
    accepted exactly as by ``POST /api/tasks`` and answered on its own — ``{taskId,
    status: 201, task}`` or ``{taskId, status, error}`` — in order. All in one transaction
    unless one is refused (``Delegation.accept_tasks``)."""
    answers = env.commands.accept_tasks(who, [_handover(task) for task in body.tasks])
    pairs = zip(body.tasks, answers, strict=True)
    return {"results": [_result(task.taskId, answer) for task, answer in pairs]}


def _result(task_id: str, answer: dict[str, Any] | TetherError) -> dict[str, Any]:
    if isinstance(answer, TetherError):
        return {"taskId": task_id, "status": answer.status, "error": answer.to_dict()}
    return {"taskId": task_id, "status": 201, "task": answer}


def _handover(body: AcceptTask) -> Handover:
    return Handover(
        task_id=body.taskId,
        text=body.task,
        origin=body.origin,
        provider=body.provider,
        title=body.title,
        hold=body.hold,
        mode=body.mode,
        model=body.model,
    )
