"""``/api/threads``: create, message, read, wait on, interrupt threads; mint credentials."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from tether.api.auth import caller, environment_dependency
from tether.api.models import CreateThread, Credentials, Interrupt, PostMessage
from tether.environment import Environment
from tether.errors import Forbidden, NotFound
from tether.types import Caller

router = APIRouter(prefix="/api/threads", tags=["threads"])
Who = Annotated[Caller, Depends(caller)]
Env = Annotated[Environment, Depends(environment_dependency)]


def _with_origin(who: Caller, origin: dict[str, Any] | None) -> Caller:
    """A link call may say which remote thread asks; trusted only inside its fence."""
    if origin and who.kind == "link":
        return Caller("link", token_id=who.token_id, origin=origin)
    return who


@router.post("", status_code=201)
async def create_thread(body: CreateThread, who: Who, env: Env) -> dict[str, Any]:
    return env.commands.create_thread(
        who, body.provider, body.title, body.message, body.clientRequestId, model=body.model
    )


@router.get("")
async def list_threads(who: Who, env: Env) -> dict[str, Any]:
    return {"threads": env.queries.threads(who)}


@router.post("/{thread_id}/messages")
async def post_message(thread_id: str, body: PostMessage, who: Who, env: Env) -> dict[str, Any]:
    return env.commands.post_message(
        _with_origin(who, body.origin), thread_id, body.text, body.mode, body.clientRequestId
    )


@router.get("/{thread_id}")
async def get_thread(thread_id: str, who: Who, env: Env) -> dict[str, Any]:
    return env.queries.thread(who, thread_id)


@router.get("/{thread_id}/messages")
async def read_messages(
    thread_id: str,
    who: Who,
    env: Env,
    afterPosition: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    return env.queries.messages(who, thread_id, afterPosition, limit)


@router.get("/{thread_id}/wait")
async def wait_thread(
    thread_id: str,
    who: Who,
    env: Env,
    untilSettled: bool = False,
    afterRunId: str | None = None,
    timeoutMs: Annotated[int, Query(ge=0, le=3_600_000)] = 30_000,
) -> dict[str, Any]:
    return await env.tools.thread_wait(
        who, thread_id, untilSettled=untilSettled, afterRunId=afterRunId, timeoutMs=timeoutMs
    )


@router.post("/{thread_id}/interrupt")
async def interrupt(thread_id: str, who: Who, env: Env, body: Interrupt | None = None) -> dict[str, Any]:
    return env.commands.interrupt(who, thread_id, bool(body and body.stop))


@router.post("/{thread_id}/items/{item_id}/stop")
async def stop_item(thread_id: str, item_id: str, who: Who, env: Env) -> dict[str, Any]:
    """Stop one background item of the thread: a command or monitor ends (its thread is
    woken to learn it), a schedule will not fire, a task is cancelled."""
    items = env.queries.thread(who, thread_id)["background"]  # 404 outside the caller's fence
    if not any(item["id"] == item_id for item in items):
        raise NotFound(f"no background item {item_id!r} in thread {thread_id}")
    return env.commands.stop_item(who, item_id)


@router.post("/{thread_id}/credentials")
async def credentials(
    thread_id: str, request: Request, who: Who, env: Env, body: Credentials | None = None
) -> dict[str, Any]:
    if who.kind != "admin":
        raise Forbidden("only the admin token can mint thread credentials")
    env.queries.thread(who, thread_id)  # 404 for an unknown thread
    record, token = env.tokens.mint(
        f"thread {thread_id}", "thread", thread_id, body.ttlSeconds if body else None
    )
    base = str(request.base_url).rstrip("/")
    return {"token": token, "tokenId": record.id, "mcpUrl": f"{base}/mcp", "expiresAt": record.expires_at}
