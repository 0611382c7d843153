"""Reading linked environments for the web page, through each link's own client.

The page of this server shows threads of the environments it links to: it asks them with
the link's token (so it sees exactly what the fence shows this environment: the threads
its tasks created there) and renders their answers with the same functions as its own.
Calls are short: an unreachable peer is shown as such, never waited on for long.
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import Any

import httpx

from tether.errors import NotFound, TetherError
from tether.ids import now
from tether.peers import Peer

TIMEOUT = 2.0


def peer(env: Any, environment_id: str) -> Peer:
    found = env.peers.peers.get(environment_id)
    if found is None:
        raise NotFound(f"no linked environment {environment_id!r}")
    return found


async def call(link: Peer, method: str, path: str, timeout: float = TIMEOUT, **kwargs: Any) -> Any:
    """One short call to the peer; a TetherError says what went wrong (unreachable, 404 …)."""
    return await link.client.once(method, path, timeout, **kwargs)


#: The threads each linked environment last showed us (environment id → thread id →
#: summary, and when): an unreachable peer's threads stay on the page, marked stale,
#: instead of vanishing behind one error line.
_LAST_KNOWN: dict[str, dict[str, dict[str, Any]]] = {}
_SEEN_AT: dict[str, str] = {}
SUMMARY_FIELDS = (
    "threadId", "environmentId", "provider", "model", "title", "status", "settled", "parentEnvironmentId",
    "parentThreadId", "taskId", "cancelled", "createdAt", "attention", "attentionSince", "lastRun",
)  # fmt: skip


def _remember(environment_id: str, summaries: list[dict[str, Any]], complete: bool) -> None:
    known = {} if complete else _LAST_KNOWN.setdefault(environment_id, {})
    for summary in summaries:
        known[summary["threadId"]] = {key: summary.get(key) for key in SUMMARY_FIELDS}
    _LAST_KNOWN[environment_id] = known
    if complete:
        _SEEN_AT[environment_id] = now()


def _stale(environment_id: str, summary: dict[str, Any], error: str) -> dict[str, Any]:
    return {**summary, "stale": {"error": error, "seenAt": _SEEN_AT.get(environment_id)}}


async def threads(link: Peer) -> list[dict[str, Any]]:
    found = [
        {**summary, "environmentId": summary.get("environmentId") or link.environment_id}
        for summary in (await call(link, "GET", "/api/threads"))["threads"]
    ]
    _remember(link.environment_id, found, complete=True)
    return found


def _problem(link: Peer, error: BaseException) -> str:
    message = error.message if isinstance(error, TetherError) else str(error)
    return message if message.startswith(link.link.name) else f"{link.link.name}: {message}"


async def all_threads(env: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """Every linked environment's threads (as its fence shows them to us), and problems:
    a peer that does not answer is named, and its threads are the last ones it showed,
    each marked stale."""
    links = [p for p in env.peers.peers.values() if p.link.kind == "tether"]  # A2A agents show none
    answers = await asyncio.gather(*(threads(p) for p in links), return_exceptions=True)
    found: list[dict[str, Any]] = []
    problems: list[str] = []
    for link, answer in zip(links, answers, strict=True):
        if not isinstance(answer, BaseException):
            found += answer
            continue
        problem = _problem(link, answer)
        known = _LAST_KNOWN.get(link.environment_id, {})
        seen = f"; its {len(known)} threads are shown as last seen at {_SEEN_AT[link.environment_id]}"
        problems.append(problem + (seen if known else ""))
        found += [_stale(link.environment_id, summary, problem) for summary in known.values()]
    return found, problems


async def thread(link: Peer, thread_id: str) -> dict[str, Any]:
    found = dict(await call(link, "GET", f"/api/threads/{thread_id}"))
    _remember(link.environment_id, [{**found, "environmentId": link.environment_id}], complete=False)
    return found


async def thread_summary(link: Peer, thread_id: str) -> dict[str, Any]:
    """A linked thread's row: read now, or — when the read fails — the last one seen,
    marked stale with the error (a failed read is shown, never dropped)."""
    try:
        found = await thread(link, thread_id)
    except TetherError as error:
        known = _LAST_KNOWN.get(link.environment_id, {}).get(thread_id) or {
            "threadId": thread_id,
            "environmentId": link.environment_id,
            "title": None,
        }
        return _stale(link.environment_id, known, _problem(link, error))
    return {**found, "environmentId": link.environment_id}


async def cursor_lag(link: Peer, timeout: float = TIMEOUT) -> int | None:
    """How many task events of the peer's feed lie past the cursor this environment has
    applied: read the feed from the cursor until its first keepalive. None: unknown."""
    if link.link.kind != "tether":
        return None  # an A2A agent has no event feed of ours to lag behind
    cursor = link.view().get("cursor") or "0"
    count, connected = 0, False
    try:
        async with asyncio.timeout(timeout), aclosing(link.client.feed(cursor, 0.1, timeout)) as feed:
            async for events in feed:
                if (connected and not events) or count >= 10_000:
                    return count  # a chunk with nothing but a keepalive: the backlog is read
                connected = True
                count += sum(event["type"].startswith("task.") for _, event in events)
    except (httpx.HTTPError, TetherError, TimeoutError):
        return None
    return count


#: Why a linked child's task failed (task id → error), as its environment reads it: a
#: failed task never changes, so each is asked once.
_FAILURES: dict[str, str] = {}


async def fill_failures(env: Any, tasks: list[dict[str, Any]]) -> None:
    """Add to each failed task of a linked child the reason its environment gives (the
    record here mirrors the status and result text, not the child's error)."""
    for task in tasks:
        result = task.get("result") or {}
        link = env.peers.peers.get(task.get("childEnvironmentId"))
        if (
            link is None
            or link.link.kind != "tether"
            or result.get("status") != "failed"
            or result.get("error")
        ):
            continue
        if task["taskId"] not in _FAILURES:
            if link.link.status != "ok":
                continue  # asked again once the link is back, never waited on meanwhile
            try:
                found = await call(link, "GET", f"/api/tasks/{task['taskId']}")
            except TetherError:
                continue
            error = (found.get("result") or {}).get("error")
            if not error:
                continue
            _FAILURES[task["taskId"]] = error
        task["result"] = {**result, "error": _FAILURES[task["taskId"]]}
