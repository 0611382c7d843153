"""Steering from the page: send a message (start now or queue), stop a run or everything,
stop one background item, cancel a task — here or in a linked environment — each
answered with what it stopped, by run number and command."""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import (
    Response,
)

from tether.environment import Environment
from tether.errors import Invalid, TetherError
from tether.types import ADMIN
from tether.web import model, remote
from tether.web.pages.common import (
    action_answer,
    context,
    guard,
    read_form,
)
from tether.web.pages.threads import (
    local_context,
    local_page,
    remote_context,
    remote_page,
)
from tether.web.render import thread_fragments

router = APIRouter(include_in_schema=False)


def _run_numbers(view: dict[str, Any]) -> dict[str, int]:
    return {run["runId"]: n for n, run in enumerate(view.get("runs") or [], 1)}


def _describe_runs(view: dict[str, Any], run_ids: list[str]) -> list[str]:
    numbers = _run_numbers(view)
    runs = {run["runId"]: run for run in view.get("runs") or []}
    found = []
    for run_id in run_ids:
        run = runs.get(run_id, {})
        how = f"worked {model.elapsed(run['startedAt'])}" if run.get("startedAt") else "queued, never started"
        found.append(f"run #{numbers.get(run_id, '?')} ({how})")
    return found


def _describe_items(view: dict[str, Any], item_ids: list[str], ctx: model.Context) -> list[str]:
    rows = {row["itemId"]: row for row in model.background_rows(view, ctx)}
    found = []
    for item_id in item_ids:
        row = rows.get(item_id)
        if row is None:
            found.append(f"item {item_id}")
        elif row["kind"] == "task":
            found.append(f"task “{row['what']}”")
        else:
            found.append(
                f"{row['kind']} “{model.short(row['what'], 60)}” (ran {model.elapsed(row['startedAt'])})"
            )
    return found


def _stopped_text(view: dict[str, Any], runs: list[str], items: list[str], ctx: model.Context) -> str:
    parts = _describe_runs(view, runs) + _describe_items(view, items, ctx)
    return "stopped " + ", ".join(parts) if parts else "nothing was running, so nothing was stopped"


def _active_runs(view: dict[str, Any]) -> list[str]:
    return [r["runId"] for r in view.get("runs") or [] if r["status"] in ("queued", "running")]


async def _thread_answer(request: Request, env: Environment, thread_id: str, notice: str) -> Response:
    _, page = await local_page(env, thread_id)
    return action_answer(request, thread_fragments(page, None, **local_context(thread_id)), notice)


async def _message_form(request: Request) -> tuple[str, str]:
    """A message form's text and when (``now``: stop the running turn and go first)."""
    form = await read_form(request)
    text = form.get("text", "").strip()
    if not text:
        raise Invalid("the message is empty")
    when = form.get("when", "now")
    if when not in ("now", "queue"):
        raise Invalid("when must be 'now' or 'queue'")
    return text, when


@router.post("/ui/threads/{thread_id}/message")
async def send_message(request: Request, thread_id: str) -> Response:
    env = guard(request)
    text, when = await _message_form(request)
    before = env.queries.thread(ADMIN, thread_id)
    sent = env.commands.post_message(ADMIN, thread_id, text, when)
    after = env.queries.thread(ADMIN, thread_id)
    notice = "Message sent: " + _sent_text(sent, after) + _superseded_text(before, sent, env) + "."
    return await _thread_answer(request, env, thread_id, notice)


def _superseded_text(before: dict[str, Any], sent: dict[str, Any], env: Environment) -> str:
    """What a ``now`` message stopped to go first, by run number on the page."""
    if not sent.get("stoppedRuns"):
        return ""
    return "; to start it now, " + _stopped_text(before, sent["stoppedRuns"], [], context(env))


def _sent_text(sent: dict[str, Any], after: dict[str, Any]) -> str:
    """Which run a sent message started or joined, by its number on the page."""
    numbers = _run_numbers(after)
    number = numbers.get(sent["runId"], 0)
    if sent["delivery"] == "started":
        return f"it started run #{number}"
    ahead = [numbers[run_id] for run_id in _active_runs(after) if numbers[run_id] < number]
    waits = f" behind run{'s' if len(ahead) != 1 else ''} #{', #'.join(map(str, ahead))}" if ahead else ""
    return f"it is queued as run #{number}{waits}"


@router.post("/ui/threads/{thread_id}/stop")
async def stop_thread(request: Request, thread_id: str) -> Response:
    env = guard(request)
    form = await read_form(request)
    everything = form.get("all") == "1"
    before = env.queries.thread(ADMIN, thread_id)
    result = await env.tools.thread_interrupt(ADMIN, thread_id, stop=everything)
    text = _stopped_text(before, result["stoppedRuns"], result["stoppedItems"], context(env))
    return await _thread_answer(request, env, thread_id, text[0].upper() + text[1:] + ".")


@router.post("/ui/items/{item_id}/stop")
async def stop_item(request: Request, item_id: str) -> Response:
    env = guard(request)
    result = env.commands.stop_item(ADMIN, item_id)
    thread_id = result["threadId"]
    view = env.queries.thread(ADMIN, thread_id)
    notice = _item_notice(result, _describe_items(view, [item_id], context(env))[0])
    return await _thread_answer(request, env, thread_id, notice)


def _item_notice(result: dict[str, Any], what: str) -> str:
    if not result["stopped"]:
        return f"The {what} had already ended: nothing was stopped."
    if result["kind"] == "task":
        return f"Cancelled {what}."
    if result["kind"] == "schedule":
        return f"Stopped {what}: it will not fire."
    return f"Stopped {what}; the thread is woken to learn that it ended."


async def _cancel_local(env: Environment, task_id: str) -> tuple[dict[str, Any], str]:
    """Cancel a task whose record is here; what it stopped, in words."""
    task = env.queries.task(ADMIN, task_id)
    title = f"“{task['title']}”" if task.get("title") else task_id
    if task["status"] not in ("queued", "running"):
        return task, f"Task {title} was already {task['status']}: nothing was cancelled."
    local_child = task["childEnvironmentId"] == env.environment_id and task["childThreadId"]
    child = env.queries.thread(ADMIN, task["childThreadId"]) if local_child else None
    await env.tools.task_cancel(ADMIN, task_id, "cancelled from the web page")
    if child is None:
        where = context(env).name(task["childEnvironmentId"])
        return task, (
            f"Cancelled task {title}; the cancel goes to {where}, which stops the child's runs "
            "and background work there."
        )
    running = [i["id"] for i in child["background"] if i["status"] == "running"]
    stopped = _stopped_text(child, _active_runs(child), running, context(env))
    return task, f"Cancelled task {title}: in the child thread, {stopped}."


@router.post("/ui/tasks/{task_id}/cancel")
async def cancel_task(request: Request, task_id: str) -> Response:
    env = guard(request)
    task, notice = await _cancel_local(env, task_id)
    parent = task["parentThreadId"]
    if task["parentEnvironmentId"] == env.environment_id:
        return await _thread_answer(request, env, parent, notice)
    return action_answer(request, [], notice)


# ---------------------------------------------------------------------- steering a linked environment


async def _remote_answer(
    request: Request, env: Environment, environment_id: str, thread_id: str, notice: str
) -> Response:
    try:
        page = await remote_page(env, environment_id, thread_id)
        fragments = thread_fragments(page, None, **remote_context(environment_id, thread_id))
    except TetherError:
        fragments = []
    return action_answer(request, fragments, notice)


@router.post("/ui/env/{environment_id}/threads/{thread_id}/message")
async def send_remote(request: Request, environment_id: str, thread_id: str) -> Response:
    env = guard(request)
    text, when = await _message_form(request)
    link = remote.peer(env, environment_id)
    before = await remote.thread(link, thread_id)
    sent = await remote.call(
        link, "POST", f"/api/threads/{thread_id}/messages", json={"text": text, "mode": when}
    )
    how = _sent_text(sent, await remote.thread(link, thread_id)) + _superseded_text(before, sent, env)
    notice = f"Message sent to {link.link.name}: {how}."
    return await _remote_answer(request, env, environment_id, thread_id, notice)


@router.post("/ui/env/{environment_id}/threads/{thread_id}/items/{item_id}/stop")
async def stop_remote_item(request: Request, environment_id: str, thread_id: str, item_id: str) -> Response:
    """Stop a command, monitor or schedule of a thread in a linked environment."""
    env = guard(request)
    link = remote.peer(env, environment_id)
    before = await remote.thread(link, thread_id)
    result = await remote.call(link, "POST", f"/api/threads/{thread_id}/items/{item_id}/stop")
    what = _describe_items(before, [item_id], context(env, environment_id))[0]
    notice = _item_notice(result, f"{what} in {link.link.name}")
    return await _remote_answer(request, env, environment_id, thread_id, notice)


@router.post("/ui/env/{environment_id}/threads/{thread_id}/stop")
async def stop_remote(request: Request, environment_id: str, thread_id: str) -> Response:
    env = guard(request)
    form = await read_form(request)
    link = remote.peer(env, environment_id)
    before = await remote.thread(link, thread_id)
    result = await remote.call(
        link, "POST", f"/api/threads/{thread_id}/interrupt", json={"stop": form.get("all") == "1"}
    )
    text = _stopped_text(before, result["stoppedRuns"], result["stoppedItems"], context(env, environment_id))
    return await _remote_answer(request, env, environment_id, thread_id, text[0].upper() + text[1:] + ".")


@router.post("/ui/env/{environment_id}/tasks/{task_id}/cancel")
async def cancel_remote(request: Request, environment_id: str, task_id: str) -> Response:
    env = guard(request)
    form = await read_form(request)
    link = remote.peer(env, environment_id)
    task = await remote.call(link, "GET", f"/api/tasks/{task_id}")
    title = f"“{task['title']}”" if task.get("title") else task_id
    if task["status"] not in ("queued", "running"):
        notice = f"Task {title} was already {task['status']}: nothing was cancelled."
    else:
        await remote.call(
            link, "POST", f"/api/tasks/{task_id}/cancel", json={"reason": "cancelled from the web page"}
        )
        notice = (
            f"Cancelled task {title} in {link.link.name}: "
            "its child's runs and background work there are stopped."
        )
    back = form.get("back", "")
    match = re.fullmatch(r"/env/[^/]+/threads/([^/]+)", back)
    if match:
        return await _remote_answer(request, env, environment_id, match.group(1), notice)
    return action_answer(request, [], notice)
