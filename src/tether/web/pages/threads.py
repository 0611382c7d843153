"""The threads list, a thread's page (here or in a linked environment, read through the
link) and a monitor's own page with every line it printed."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import (
    HTMLResponse,
    RedirectResponse,
    Response,
)

from tether.api.auth import environment
from tether.environment import Environment
from tether.errors import NotFound, TetherError
from tether.types import ADMIN
from tether.web import model, remote
from tether.web.pages.common import (
    context,
    html_page,
    signed_in,
    to_signin,
)
from tether.web.render import thread_model

router = APIRouter(include_in_schema=False)


def env_summary(env: Environment, overview: dict[str, Any] | None = None) -> dict[str, Any]:
    overview = overview or env.queries.overview()
    return {
        "environment": env.name,
        "threads": overview["threads"],
        "background": overview["background"],
        "linked": [peer.link.name for peer in env.peers.peers.values()],
    }


def local_row(env: Environment, ctx: model.Context, thread_id: str) -> dict[str, Any] | None:
    """One thread's row, read as ``GET /api/threads`` reads it (the same attention)."""
    summary = env.queries.thread_row(ADMIN, thread_id)
    if summary is None:
        return None
    return model.thread_row(summary, ctx, summary["running"], summary["parentTitle"])


@router.get("/", response_class=HTMLResponse)
async def threads_page(request: Request) -> Response:
    if not signed_in(request):
        return to_signin(request)
    env = environment(request)
    cursor = env.store.last_event_seq()  # before reading: nothing after it is missed
    ctx = context(env)
    overview = env.queries.overview()
    counts = overview["runningByThread"]
    local = env.queries.threads(ADMIN)
    titles = {t["threadId"]: t.get("title") or "untitled" for t in local}
    found, problems = await remote.all_threads(env)
    rows = [
        model.thread_row(t, ctx, counts.get(t["threadId"]), titles.get(t.get("parentThreadId") or ""))
        for t in local + found
    ]
    return html_page(
        request,
        "threads.html",
        "Threads",
        page="threads",
        groups=model.group_rows(rows),
        summary=env_summary(env, overview),
        problems=problems,
        live="/ui/live?view=threads",
        cursor=cursor,
    )


def local_context(thread_id: str) -> dict[str, Any]:
    return {
        "actions": f"/ui/threads/{thread_id}",
        "task_actions": "/ui/tasks",
        "item_actions": "/ui/items",
        "here": f"/threads/{thread_id}",
    }


def remote_context(environment_id: str, thread_id: str) -> dict[str, Any]:
    return {
        "actions": f"/ui/env/{environment_id}/threads/{thread_id}",
        "task_actions": f"/ui/env/{environment_id}/tasks",
        "item_actions": f"/ui/env/{environment_id}/threads/{thread_id}/items",
        "here": f"/env/{environment_id}/threads/{thread_id}",
    }


def _own_task(env: Environment, view: dict[str, Any]) -> dict[str, Any] | None:
    if not view.get("taskId"):
        return None
    try:
        return env.queries.task(ADMIN, view["taskId"])
    except NotFound:
        return None


async def local_page(env: Environment, thread_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    view = env.queries.thread(ADMIN, thread_id)
    for item in view["background"]:
        if item["kind"] == "command" and not item.get("lastLine"):
            item["lastLine"] = env.runtime.processes.last_line(item["id"])
    await remote.fill_failures(env, view["tasks"])
    return view, thread_model(view, context(env), _own_task(env, view))


@router.get("/threads/{thread_id}", response_class=HTMLResponse)
async def thread_page(request: Request, thread_id: str) -> Response:
    if not signed_in(request):
        return to_signin(request)
    env = environment(request)
    cursor = env.store.last_event_seq()
    try:
        _, page = await local_page(env, thread_id)
    except NotFound as error:
        return html_page(request, "message.html", "Not found", status=404, text=error.message)
    return _thread_html(request, page, f"view=thread&thread={thread_id}", cursor, local_context(thread_id))


def _thread_html(
    request: Request, page: dict[str, Any], live: str, cursor: int, where: dict[str, Any]
) -> HTMLResponse:
    """A thread's page, here or linked: ``live`` is what its live feed follows."""
    title, live = page["head"]["title"], f"/ui/live?{live}"
    return html_page(
        request, "thread.html", title, page="thread", model=page, live=live, cursor=cursor, **where
    )


async def remote_page(env: Environment, environment_id: str, thread_id: str) -> dict[str, Any]:
    view = await remote.thread(remote.peer(env, environment_id), thread_id)
    return thread_model(view, context(env, environment_id), _own_task(env, view))


@router.get("/env/{environment_id}/threads/{thread_id}", response_class=HTMLResponse)
async def remote_thread_page(request: Request, environment_id: str, thread_id: str) -> Response:
    """A thread of a linked environment, read through the link (as its fence shows it)."""
    if not signed_in(request):
        return to_signin(request)
    env = environment(request)
    if environment_id == env.environment_id:
        return RedirectResponse(f"/threads/{thread_id}", status_code=303)
    cursor = env.store.last_event_seq()
    try:
        page = await remote_page(env, environment_id, thread_id)
    except TetherError as error:
        return html_page(
            request,
            "message.html",
            "Not reachable",
            status=error.status if error.status < 500 else 502,
            text=error.message,
        )
    live = f"view=remote&env={environment_id}&thread={thread_id}"
    return _thread_html(request, page, live, cursor, remote_context(environment_id, thread_id))


def _monitor_answer(request: Request, view: dict[str, Any], item_id: str, back: str) -> HTMLResponse:
    entry = model.monitor_page(view, item_id)
    if entry is None:
        text = f"no monitor output {item_id!r} here"
        return html_page(request, "message.html", "Not found", status=404, text=text)
    title = view.get("title") or "untitled"
    return html_page(
        request, "monitor_page.html", f"Monitor of {title}", entry=entry, back=back, thread_title=title
    )


@router.get("/threads/{thread_id}/monitors/{item_id}", response_class=HTMLResponse)
async def monitor_page(request: Request, thread_id: str, item_id: str) -> Response:
    """Every line a monitor printed and every progress reply it drew (the thread page
    shows only the latest ones)."""
    if not signed_in(request):
        return to_signin(request)
    try:
        view = environment(request).queries.thread(ADMIN, thread_id)
    except NotFound as error:
        return html_page(request, "message.html", "Not found", status=404, text=error.message)
    return _monitor_answer(request, view, item_id, f"/threads/{thread_id}")


@router.get("/env/{environment_id}/threads/{thread_id}/monitors/{item_id}", response_class=HTMLResponse)
async def remote_monitor_page(
    request: Request, environment_id: str, thread_id: str, item_id: str
) -> Response:
    if not signed_in(request):
        return to_signin(request)
    try:
        view = await remote.thread(remote.peer(environment(request), environment_id), thread_id)
    except TetherError as error:
        status = error.status if error.status < 500 else 502
        return html_page(request, "message.html", "Not reachable", status=status, text=error.message)
    return _monitor_answer(request, view, item_id, f"/env/{environment_id}/threads/{thread_id}")
