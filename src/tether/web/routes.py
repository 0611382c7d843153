"""The web page (SPEC §10): server-rendered pages, a live feed of re-rendered fragments, and
actions as plain POSTs that answer with the fragments they changed.

Everything shown comes from the API's own reads (:class:`tether.engine.queries.Queries`,
with ``attention`` and ``ledger`` from the domain) and the API's own commands and tools; this
module only lays them out. Sign-in takes the admin token and keeps it in the HttpOnly
``tether_token`` cookie, which :func:`tether.api.auth.bearer` accepts; the sign-in form and
the static files are the only things open without it, every other page redirects to
sign-in, and the feed and actions answer 401.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
from collections import Counter
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, quote, urlsplit

from fastapi import APIRouter, Query, Request
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)

from tether import __version__
from tether.api.auth import bearer, environment
from tether.api.events import event_json
from tether.domain.records import Item, Thread
from tether.domain.views import thread_summary
from tether.engine.queries import attention_fields
from tether.environment import Environment
from tether.errors import Forbidden, Invalid, NotFound, TetherError, Unauthorized
from tether.types import ADMIN
from tether.web import model, remote
from tether.web.render import fragment as make_fragment
from tether.web.render import render, row_fragment, thread_fragments, thread_model

router = APIRouter(include_in_schema=False)
COOKIE = "tether_token"
STATIC = Path(__file__).parent / "static"
KEEPALIVE = 15.0
#: How often the environments page looks at its links' own state (reachability, last
#: error, cursor: kept by each link's follower), whatever the event feed does.
LINK_WATCH = 0.5
#: How often it re-measures each link's cursor lag (a read of the peer's feed) unchanged.
LAG_REFRESH = 10.0
_STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png", ".svg": "image/svg+xml"}


# ---------------------------------------------------------------------- access


def signed_in(request: Request) -> bool:
    token = bearer(request)
    return bool(token) and hmac.compare_digest(token or "", environment(request).admin_token)


def _guard(request: Request) -> Environment:
    """Actions and the feed: the admin token (cookie or header), and no cross-site POST."""
    if not signed_in(request):
        raise Unauthorized("sign in with the admin token first")
    origin = request.headers.get("origin")
    if request.method == "POST" and origin and urlsplit(origin).netloc != request.headers.get("host"):
        raise Forbidden("a request from another site is refused")
    return environment(request)


def _to_signin(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/signin?next={quote(target)}", status_code=303)


def _safe_next(target: str | None) -> str:
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


async def _form(request: Request) -> dict[str, str]:
    body = (await request.body()).decode("utf-8", "replace")
    return {key: values[0] for key, values in parse_qs(body, keep_blank_values=True).items()}


def context(env: Environment, here: str | None = None) -> model.Context:
    linked = {peer.environment_id: peer.link.name for peer in env.peers.peers.values()}
    return model.Context(env.environment_id, env.name, linked, here)


def _page(request: Request, template: str, title: str, status: int = 200, **extra: Any) -> HTMLResponse:
    env = environment(request)
    html = render(
        template,
        env_name=env.name,
        env_id=env.environment_id,
        title=title,
        signed_in=extra.pop("signed_in", True),
        notice=request.query_params.get("notice"),
        **extra,
    )
    return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})


def _stamp(fragments: list[dict[str, Any]], version: int) -> list[dict[str, Any]]:
    """Mark fragments with the newest event their state includes (at least): the page never
    lets an older fragment (an action's answer that arrives late) replace a newer one. A
    fragment labelled too low is harmless: the live feed re-renders after those events."""
    for fragment in fragments:
        fragment["v"] = version
    return fragments


def _answer(
    request: Request, fragments: list[dict[str, Any]], notice: str, secret: str | None = None
) -> Response:
    """An action's answer: the fragments it changed and what it did (or, without script,
    a page that says so)."""
    html = render("partials/notice.html", notice=notice, secret=secret)
    _stamp(fragments, environment(request).store.last_event_seq())
    if request.headers.get("x-tether-fragment"):
        return JSONResponse({"fragments": fragments, "notice": html})
    return _page(request, "message.html", "Done", text=notice + (f" Token: {secret}" if secret else ""))


# ---------------------------------------------------------------------- sign-in, static


@router.get("/signin", response_class=HTMLResponse)
async def signin_form(request: Request, next: str = "/") -> HTMLResponse:
    return _page(request, "signin.html", "Sign in", next=_safe_next(next), signed_in=False, page="signin")


@router.post("/signin")
async def signin(request: Request) -> Response:
    env = environment(request)
    form = await _form(request)
    token = form.get("token", "").strip()
    target = _safe_next(form.get("next"))
    if not token or not hmac.compare_digest(token, env.admin_token):
        return _page(
            request,
            "signin.html",
            "Sign in",
            status=401,
            next=target,
            signed_in=False,
            error="That is not this environment's admin token.",
        )
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        COOKIE,
        token,
        httponly=True,
        samesite="lax",
        path="/",
        secure=request.url.scheme == "https",
        max_age=30 * 24 * 3600,
    )
    return response


@router.post("/signout")
async def signout(request: Request) -> Response:
    response = RedirectResponse("/signin", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


@router.get("/static/{name}")
async def static(name: str) -> Response:
    path = STATIC / name
    if not re.fullmatch(r"[a-z0-9_-]+\.[a-z]+", name) or not path.is_file():
        raise NotFound(f"no static file {name!r}")
    return FileResponse(
        path,
        media_type=_STATIC_TYPES.get(path.suffix, "application/octet-stream"),
        headers={"Cache-Control": "no-cache"},
    )


@router.get("/ui/ping")
async def ping(request: Request) -> Response:
    _guard(request)
    return Response(status_code=204)


# ---------------------------------------------------------------------- threads


def _summary(env: Environment) -> dict[str, Any]:
    with env.store.read() as reader:
        threads = reader.count(Thread)
        background = reader.count(Item, status="running")
    return {
        "environment": env.name,
        "threads": threads,
        "background": background,
        "linked": [peer.link.name for peer in env.peers.peers.values()],
    }


def _background_counts(env: Environment) -> Counter[str]:
    with env.store.read() as reader:
        return Counter(item.thread_id for item in reader.find(Item, status="running"))


def _local_row(env: Environment, ctx: model.Context, thread_id: str) -> dict[str, Any] | None:
    """One thread's row, read as ``GET /api/threads`` reads it (the same attention)."""
    with env.commands.view() as u:
        thread = u.load(Thread, thread_id)
        if thread is None:
            return None
        summary = {**thread_summary(thread, env.environment_id), **attention_fields(u, thread)}
        running = len(u.query(Item, thread_id=thread_id, status="running"))
    return model.thread_row(summary, ctx, running, _parent_title(env, summary))


def _parent_title(env: Environment, summary: dict[str, Any]) -> str | None:
    """The title of a row's parent thread, when that parent is here."""
    if not summary.get("parentThreadId") or summary.get("parentEnvironmentId") != env.environment_id:
        return None
    with env.store.read() as reader:
        parent = reader.get(Thread, summary["parentThreadId"])
    return (parent.title or "untitled") if parent is not None else None


@router.get("/", response_class=HTMLResponse)
async def threads_page(request: Request) -> Response:
    if not signed_in(request):
        return _to_signin(request)
    env = environment(request)
    cursor = env.store.last_event_seq()  # before reading: nothing after it is missed
    ctx = context(env)
    counts = _background_counts(env)
    local = env.queries.threads(ADMIN)
    titles = {t["threadId"]: t.get("title") or "untitled" for t in local}
    found, problems = await remote.all_threads(env)
    rows = [
        model.thread_row(t, ctx, counts.get(t["threadId"]), titles.get(t.get("parentThreadId") or ""))
        for t in local + found
    ]
    return _page(
        request,
        "threads.html",
        "Threads",
        page="threads",
        groups=model.group_rows(rows),
        summary=_summary(env),
        problems=problems,
        live="/ui/live?view=threads",
        cursor=cursor,
    )


def _local_context(thread_id: str) -> dict[str, Any]:
    return {
        "actions": f"/ui/threads/{thread_id}",
        "task_actions": "/ui/tasks",
        "item_actions": "/ui/items",
        "here": f"/threads/{thread_id}",
    }


def _remote_context(environment_id: str, thread_id: str) -> dict[str, Any]:
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


def _last_output_line(env: Environment, item_id: str) -> str | None:
    """The last line a background command wrote (its output file; no event announces it)."""
    try:
        with open(env.runtime.processes.dir(item_id) / "out", "rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - 4096))
            lines = handle.read().decode("utf-8", "replace").strip().splitlines()
    except (OSError, AttributeError):
        return None
    return lines[-1] if lines else None


async def _local_page(env: Environment, thread_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    view = env.queries.thread(ADMIN, thread_id)
    for item in view["background"]:
        if item["kind"] == "command" and not item.get("lastLine"):
            item["lastLine"] = _last_output_line(env, item["id"])
    await remote.fill_failures(env, view["tasks"])
    return view, thread_model(view, context(env), _own_task(env, view))


@router.get("/threads/{thread_id}", response_class=HTMLResponse)
async def thread_page(request: Request, thread_id: str) -> Response:
    if not signed_in(request):
        return _to_signin(request)
    env = environment(request)
    cursor = env.store.last_event_seq()
    try:
        _, page = await _local_page(env, thread_id)
    except NotFound as error:
        return _page(request, "message.html", "Not found", status=404, text=error.message)
    return _page(
        request,
        "thread.html",
        page["head"]["title"],
        page="thread",
        model=page,
        live=f"/ui/live?view=thread&thread={thread_id}",
        cursor=cursor,
        **_local_context(thread_id),
    )


async def _remote_page(env: Environment, environment_id: str, thread_id: str) -> dict[str, Any]:
    view = await remote.thread(remote.peer(env, environment_id), thread_id)
    return thread_model(view, context(env, environment_id), _own_task(env, view))


@router.get("/env/{environment_id}/threads/{thread_id}", response_class=HTMLResponse)
async def remote_thread_page(request: Request, environment_id: str, thread_id: str) -> Response:
    """A thread of a linked environment, read through the link (as its fence shows it)."""
    if not signed_in(request):
        return _to_signin(request)
    env = environment(request)
    if environment_id == env.environment_id:
        return RedirectResponse(f"/threads/{thread_id}", status_code=303)
    cursor = env.store.last_event_seq()
    try:
        page = await _remote_page(env, environment_id, thread_id)
    except TetherError as error:
        return _page(
            request,
            "message.html",
            "Not reachable",
            status=error.status if error.status < 500 else 502,
            text=error.message,
        )
    return _page(
        request,
        "thread.html",
        page["head"]["title"],
        page="thread",
        model=page,
        live=f"/ui/live?view=remote&env={environment_id}&thread={thread_id}",
        cursor=cursor,
        **_remote_context(environment_id, thread_id),
    )


def _monitor_answer(request: Request, view: dict[str, Any], item_id: str, back: str) -> HTMLResponse:
    entry = model.monitor_page(view, item_id)
    if entry is None:
        text = f"no monitor output {item_id!r} here"
        return _page(request, "message.html", "Not found", status=404, text=text)
    title = view.get("title") or "untitled"
    return _page(
        request, "monitor_page.html", f"Monitor of {title}", entry=entry, back=back, thread_title=title
    )


@router.get("/threads/{thread_id}/monitors/{item_id}", response_class=HTMLResponse)
async def monitor_page(request: Request, thread_id: str, item_id: str) -> Response:
    """Every line a monitor printed and every progress reply it drew (the thread page
    shows only the latest ones)."""
    if not signed_in(request):
        return _to_signin(request)
    try:
        view = environment(request).queries.thread(ADMIN, thread_id)
    except NotFound as error:
        return _page(request, "message.html", "Not found", status=404, text=error.message)
    return _monitor_answer(request, view, item_id, f"/threads/{thread_id}")


@router.get("/env/{environment_id}/threads/{thread_id}/monitors/{item_id}", response_class=HTMLResponse)
async def remote_monitor_page(
    request: Request, environment_id: str, thread_id: str, item_id: str
) -> Response:
    if not signed_in(request):
        return _to_signin(request)
    try:
        view = await remote.thread(remote.peer(environment(request), environment_id), thread_id)
    except TetherError as error:
        status = error.status if error.status < 500 else 502
        return _page(request, "message.html", "Not reachable", status=status, text=error.message)
    return _monitor_answer(request, view, item_id, f"/env/{environment_id}/threads/{thread_id}")


# ---------------------------------------------------------------------- environments


def _token_view(record: Any) -> dict[str, Any]:
    return {
        "tokenId": record.id,
        "label": record.label,
        "createdAt": record.created_at,
        "lastUsedAt": record.last_used_at,
        "revoked": record.revoked,
    }


async def _links(env: Environment) -> list[dict[str, Any]]:
    peers = list(env.peers.peers.values())
    lags = await asyncio.gather(*(remote.cursor_lag(p) for p in peers))
    return [{**peer.view(), "lag": lag} for peer, lag in zip(peers, lags, strict=True)]


class LinkWatch:
    """The environments page's view of its links: each link's own state is read every
    ``LINK_WATCH`` seconds and the rows are sent when it changed (a link going down or
    coming back shows at once, even while a busy feed never leaves the page idle); the
    cursor lag, a read of the peer's feed, is measured again when the state changed or
    every ``LAG_REFRESH`` seconds."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] | None = None
        self.measured = 0.0

    async def changed(self, env: Environment) -> list[dict[str, Any]]:
        state = [tuple(peer.view().values()) for peer in env.peers.peers.values()]
        clock = asyncio.get_running_loop().time()
        if state == self.seen and clock - self.measured < LAG_REFRESH:
            return []
        self.seen, self.measured = state, clock
        return [_link_fragment(link) for link in await _links(env)]


def _link_fragment(link: dict[str, Any]) -> dict[str, Any]:
    return make_fragment(
        "partials/link_row.html", f"link-{link['environmentId']}", "links", link["name"], link=link
    )


def _token_fragment(token: dict[str, Any]) -> dict[str, Any]:
    return make_fragment(
        "partials/token_row.html", f"token-{token['tokenId']}", "tokens", token["createdAt"], token=token
    )


@router.get("/environments", response_class=HTMLResponse)
async def environments_page(request: Request) -> Response:
    if not signed_in(request):
        return _to_signin(request)
    env = environment(request)
    cursor = env.store.last_event_seq()
    summary = _summary(env)
    return _page(
        request,
        "environments.html",
        "Environments",
        page="environments",
        links=await _links(env),
        tokens=[_token_view(t) for t in env.tokens()],
        counts=summary,
        base_url=env.base_url,
        version=__version__,
        cursor=cursor,
        live="/ui/live?view=environments",
    )


# ---------------------------------------------------------------------- the live feed


def _live_cursor(env: Environment, after: str | None, last_event_id: str | None) -> int:
    newest = env.store.last_event_seq()
    cursor = 0
    for raw in (after, last_event_id):
        if raw is None or raw == "":
            continue
        if raw == "now":
            value = newest
        elif raw.isdigit() and len(raw) <= 18:
            value = int(raw)
        else:
            raise Invalid(f"event cursor must be an event id or 'now', not {raw!r}")
        cursor = max(cursor, value)
    return cursor


def _frame(kind: str, cursor: int, data: dict[str, Any]) -> str:
    return f"event: {kind}\nid: {cursor}\ndata: {json.dumps(data)}\n\n"


async def _live_fragments(
    env: Environment, view: str, subject: str | None, environment_id: str | None, keys: set[tuple[str, ...]]
) -> list[dict[str, Any]]:
    if view == "threads":
        ctx = context(env)
        found = []
        for key in sorted(keys):
            if key[0] == "row":
                row = _local_row(env, ctx, key[1])
                if row is not None:
                    found.append(row_fragment(row))
            elif key[0] == "remote-row" and key[1] in env.peers.peers:
                summary = await remote.thread_summary(remote.peer(env, key[1]), key[2])
                found.append(row_fragment(model.thread_row(summary, ctx, None, _parent_title(env, summary))))
            elif key[0] == "summary":
                found.append(
                    make_fragment("partials/summary.html", "env-summary", None, None, summary=_summary(env))
                )
        return found
    if view == "thread" and subject:
        try:
            _, page = await _local_page(env, subject)
        except NotFound:
            return []
        return thread_fragments(page, keys, **_local_context(subject))
    if view == "remote" and subject and environment_id:
        try:
            page = await _remote_page(env, environment_id, subject)
        except TetherError:
            return []
        return thread_fragments(page, None, **_remote_context(environment_id, subject))
    return []


@router.get("/ui/live")
async def live(
    request: Request,
    view: str = "threads",
    thread: str | None = None,
    environment_id: Annotated[str | None, Query(alias="env")] = None,
    after: str | None = None,
) -> StreamingResponse:
    """Fragments for what changed, after every batch of events of the feed. Each message's
    SSE ``id`` is the last event it covers: a reconnect with ``?after=`` (or
    ``Last-Event-ID``) resumes there, and re-rendering is idempotent, so a replay doubles
    nothing."""
    env = _guard(request)
    if view not in ("threads", "thread", "remote", "environments"):
        raise Invalid(f"unknown view {view!r}")
    if view in ("thread", "remote") and not thread:
        raise Invalid("this view needs ?thread=")
    cursor = _live_cursor(env, after, request.headers.get("last-event-id"))
    past_end = cursor > env.store.last_event_seq()
    local = env.environment_id
    links_watch = LinkWatch()

    async def stream() -> Any:
        nonlocal cursor
        yield "retry: 1000\n\n"
        if past_end:  # a cursor from another store (this one was replaced): start over
            yield _frame("reload", 0, {})
            return
        yield _frame("fragments", cursor, {"fragments": []})
        while not await request.is_disconnected():
            links = await links_watch.changed(env) if view == "environments" else []
            if links:
                yield _frame("fragments", cursor, {"fragments": links})
            batch = env.store.events_after(cursor, 500)
            if batch:
                events = [event_json(e, local) for e in batch]
                keys = model.affected(events, view, thread, local)
                version = env.store.last_event_seq()  # read before the state it labels
                fragments = await _live_fragments(env, view, thread, environment_id, keys) if keys else []
                _stamp(fragments, version)
                cursor = batch[-1].seq
                yield _frame("fragments", cursor, {"fragments": fragments})
                continue
            seen = cursor
            timeout = LINK_WATCH if view == "environments" else KEEPALIVE
            woke = await env.runtime.notifier.wait_until(
                ["events"], lambda seen=seen: True if env.store.last_event_seq() > seen else None, timeout
            )
            if woke is None and view != "environments":
                yield ": keepalive\n\n"

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


# ---------------------------------------------------------------------- steering: what it stopped


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
    _, page = await _local_page(env, thread_id)
    return _answer(request, thread_fragments(page, None, **_local_context(thread_id)), notice)


@router.post("/ui/threads/{thread_id}/message")
async def send_message(request: Request, thread_id: str) -> Response:
    env = _guard(request)
    form = await _form(request)
    text = form.get("text", "").strip()
    if not text:
        raise Invalid("the message is empty")
    when = form.get("when", "now")
    if when not in ("now", "queue"):
        raise Invalid("when must be 'now' or 'queue'")
    before = env.queries.thread(ADMIN, thread_id)
    stopped = ""
    running = [r["runId"] for r in before["runs"] if r["status"] == "running"]
    if when == "now" and running:
        result = await env.tools.thread_interrupt(ADMIN, thread_id)
        stopped = "; to start it now, " + _stopped_text(before, result["stoppedRuns"], [], context(env))
    sent = env.commands.post_message(ADMIN, thread_id, text, "auto" if when == "now" else "queue")
    notice = "Message sent: " + _sent_text(sent, env.queries.thread(ADMIN, thread_id)) + stopped + "."
    return await _thread_answer(request, env, thread_id, notice)


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
    env = _guard(request)
    form = await _form(request)
    everything = form.get("all") == "1"
    before = env.queries.thread(ADMIN, thread_id)
    result = await env.tools.thread_interrupt(ADMIN, thread_id, stop=everything)
    text = _stopped_text(before, result["stoppedRuns"], result["stoppedItems"], context(env))
    return await _thread_answer(request, env, thread_id, text[0].upper() + text[1:] + ".")


@router.post("/ui/items/{item_id}/stop")
async def stop_item(request: Request, item_id: str) -> Response:
    env = _guard(request)
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
    env = _guard(request)
    task, notice = await _cancel_local(env, task_id)
    parent = task["parentThreadId"]
    if task["parentEnvironmentId"] == env.environment_id:
        return await _thread_answer(request, env, parent, notice)
    return _answer(request, [], notice)


# ---------------------------------------------------------------------- steering a linked environment


async def _remote_answer(
    request: Request, env: Environment, environment_id: str, thread_id: str, notice: str
) -> Response:
    try:
        page = await _remote_page(env, environment_id, thread_id)
        fragments = thread_fragments(page, None, **_remote_context(environment_id, thread_id))
    except TetherError:
        fragments = []
    return _answer(request, fragments, notice)


@router.post("/ui/env/{environment_id}/threads/{thread_id}/message")
async def send_remote(request: Request, environment_id: str, thread_id: str) -> Response:
    env = _guard(request)
    form = await _form(request)
    text = form.get("text", "").strip()
    if not text:
        raise Invalid("the message is empty")
    link = remote.peer(env, environment_id)
    stopped = ""
    if form.get("when", "now") == "now":
        before = await remote.thread(link, thread_id)
        if any(r["status"] == "running" for r in before["runs"]):
            result = await remote.call(
                link, "POST", f"/api/threads/{thread_id}/interrupt", json={"stop": False}
            )
            stopped = "; to start it now, " + _stopped_text(before, result["stoppedRuns"], [], context(env))
    mode = "auto" if form.get("when", "now") == "now" else "queue"
    sent = await remote.call(
        link, "POST", f"/api/threads/{thread_id}/messages", json={"text": text, "mode": mode}
    )
    how = _sent_text(sent, await remote.thread(link, thread_id))
    return await _remote_answer(
        request, env, environment_id, thread_id, f"Message sent to {link.link.name}: {how}{stopped}."
    )


@router.post("/ui/env/{environment_id}/threads/{thread_id}/items/{item_id}/stop")
async def stop_remote_item(request: Request, environment_id: str, thread_id: str, item_id: str) -> Response:
    """Stop a command, monitor or schedule of a thread in a linked environment."""
    env = _guard(request)
    link = remote.peer(env, environment_id)
    before = await remote.thread(link, thread_id)
    result = await remote.call(link, "POST", f"/api/threads/{thread_id}/items/{item_id}/stop")
    what = _describe_items(before, [item_id], context(env, environment_id))[0]
    notice = _item_notice(result, f"{what} in {link.link.name}")
    return await _remote_answer(request, env, environment_id, thread_id, notice)


@router.post("/ui/env/{environment_id}/threads/{thread_id}/stop")
async def stop_remote(request: Request, environment_id: str, thread_id: str) -> Response:
    env = _guard(request)
    form = await _form(request)
    link = remote.peer(env, environment_id)
    before = await remote.thread(link, thread_id)
    result = await remote.call(
        link, "POST", f"/api/threads/{thread_id}/interrupt", json={"stop": form.get("all") == "1"}
    )
    text = _stopped_text(before, result["stoppedRuns"], result["stoppedItems"], context(env, environment_id))
    return await _remote_answer(request, env, environment_id, thread_id, text[0].upper() + text[1:] + ".")


@router.post("/ui/env/{environment_id}/tasks/{task_id}/cancel")
async def cancel_remote(request: Request, environment_id: str, task_id: str) -> Response:
    env = _guard(request)
    form = await _form(request)
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
    return _answer(request, [], notice)


# ---------------------------------------------------------------------- environments: tokens, links


@router.post("/ui/link-tokens")
async def create_link_token(request: Request) -> Response:
    env = _guard(request)
    form = await _form(request)
    label = form.get("label", "").strip()
    if not label or len(label) > 200:
        raise Invalid("a link token needs a label of 1 to 200 characters")
    record, secret = env.mint_token(label)
    notice = f"Link token “{label}” created. Copy it now: it is not shown again."
    return _answer(request, [_token_fragment(_token_view(record))], notice, secret=secret)


@router.post("/ui/link-tokens/{token_id}/revoke")
async def revoke_link_token(request: Request, token_id: str) -> Response:
    env = _guard(request)
    record = env.revoke_token(token_id)
    return _answer(
        request,
        [_token_fragment(_token_view(record))],
        f"Link token “{record.label}” revoked: every call with it now gets 401.",
    )


#: The command line's words in messages the page shows, and the page's own for them.
_PAGE_WORDS = {"--insecure": "tick “Allow plain http to a public address”"}


def _page_words(message: str) -> str:
    for cli, page in _PAGE_WORDS.items():
        message = message.replace(cli, page)
    return message


@router.post("/ui/links")
async def add_link(request: Request) -> Response:
    env = _guard(request)
    form = await _form(request)
    url, token = form.get("url", "").strip(), form.get("token", "").strip()
    kind = "a2a" if form.get("kind") == "a2a" else "tether"
    if not url or not (token or kind == "a2a"):
        raise Invalid("a link needs the URL of the other environment and a link token minted there")
    try:
        view = await env.peers.add(
            url, token or None, form.get("label", "").strip() or None, form.get("insecure") == "1", kind
        )
    except TetherError as error:
        error.message = _page_words(error.message)
        raise
    link = {**view, "lag": None}
    return _answer(request, [_link_fragment(link)], f"Linked to {view['name']} ({view['status']}).")
