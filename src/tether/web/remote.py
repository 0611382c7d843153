"""Reading linked environments for the web page, through each link's own client.

The page of this server shows threads of the environments it links to: it asks them with
the link's token (so it sees exactly what the fence shows this environment: the threads
its tasks created there) and renders their answers with the same functions as its own.
Calls are short: an unreachable peer is shown as such, never waited on for long.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import httpx

from tether.errors import NotFound, TetherError, Unavailable
from tether.peers.links import _error

if TYPE_CHECKING:
    from tether.peers.links import Peer

TIMEOUT = 2.0


def peer(env: Any, environment_id: str) -> Peer:
    found = env.peers.peers.get(environment_id)
    if found is None:
        raise NotFound(f"no linked environment {environment_id!r}")
    return found


async def call(link: Peer, method: str, path: str, timeout: float = TIMEOUT, **kwargs: Any) -> Any:
    """One call to the peer; a TetherError says what went wrong (unreachable, 404 ...)."""
    try:
        response = await link.http.request(method, path, timeout=timeout, **kwargs)
    except httpx.HTTPError as error:
        raise Unavailable(f"{link.link.name} is unreachable: {type(error).__name__}", "unreachable") from None
    if response.status_code >= 400:
        raise _error(response)
    return response.json()


async def threads(link: Peer) -> list[dict[str, Any]]:
    return list((await call(link, "GET", "/api/threads"))["threads"])


async def all_threads(env: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """Every linked environment's threads (as its fence shows them to us), and problems."""
    links = list(env.peers.peers.values())
    answers = await asyncio.gather(*(threads(p) for p in links), return_exceptions=True)
    found: list[dict[str, Any]] = []
    problems: list[str] = []
    for link, answer in zip(links, answers, strict=True):
        if isinstance(answer, BaseException):
            message = answer.message if isinstance(answer, TetherError) else str(answer)
            problems.append(f"{link.link.name}: {message}")
            continue
        for summary in answer:
            found.append({**summary, "environmentId": summary.get("environmentId") or link.environment_id})
    return found, problems


async def thread(link: Peer, thread_id: str) -> dict[str, Any]:
    return dict(await call(link, "GET", f"/api/threads/{thread_id}"))


async def cursor_lag(link: Peer, timeout: float = TIMEOUT) -> int | None:
    """How many task events of the peer's feed lie past the cursor this environment has
    applied: read the feed from the cursor until its first keepalive. None: unknown."""
    cursor = link.view().get("cursor") or "0"
    count = 0
    try:
        async with asyncio.timeout(timeout):
            async with link.http.stream(
                "GET", "/api/events", params={"after": cursor, "keepalive": "0.1"}, timeout=timeout
            ) as response:
                if response.status_code != 200:
                    return None
                async for line in response.aiter_lines():
                    if line.startswith(": keepalive"):
                        return count
                    if line.startswith("event:") and line[6:].strip().startswith("task."):
                        count += 1
                        if count >= 10_000:
                            return count
    except (httpx.HTTPError, TimeoutError):
        return None
    return count
