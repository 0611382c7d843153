"""What every page and action shares: the sign-in check (the admin token, as cookie or
header), the guard against cross-site POSTs, the page frame, and an action's answer
(the fragments it changed and a notice that says what it did)."""

from __future__ import annotations

import hmac
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from fastapi import Request
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
)

from tether.api.auth import bearer, environment
from tether.environment import Environment
from tether.errors import Forbidden, Unauthorized
from tether.web import model
from tether.web.render import render


def signed_in(request: Request) -> bool:
    token = bearer(request)
    return bool(token) and hmac.compare_digest(token or "", environment(request).admin_token)


def guard(request: Request) -> Environment:
    """Actions and the feed: the admin token (cookie or header), and no cross-site POST."""
    if not signed_in(request):
        raise Unauthorized("sign in with the admin token first")
    origin = request.headers.get("origin")
    if request.method == "POST" and origin and urlsplit(origin).netloc != request.headers.get("host"):
        raise Forbidden("a request from another site is refused")
    return environment(request)


def to_signin(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/signin?next={quote(target)}", status_code=303)


async def read_form(request: Request) -> dict[str, str]:
    body = (await request.body()).decode("utf-8", "replace")
    return {key: values[0] for key, values in parse_qs(body, keep_blank_values=True).items()}


def context(env: Environment, here: str | None = None) -> model.Context:
    linked = {peer.environment_id: peer.link.name for peer in env.peers.peers.values()}
    return model.Context(env.environment_id, env.name, linked, here)


def html_page(request: Request, template: str, title: str, status: int = 200, **extra: Any) -> HTMLResponse:
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


def stamp(fragments: list[dict[str, Any]], version: int) -> list[dict[str, Any]]:
    """Mark fragments with the newest event their state includes (at least): the page never
    lets an older fragment (an action's answer that arrives late) replace a newer one. A
    fragment labelled too low is harmless: the live feed re-renders after those events."""
    for fragment in fragments:
        fragment["v"] = version
    return fragments


def action_answer(
    request: Request, fragments: list[dict[str, Any]], notice: str, secret: str | None = None
) -> Response:
    """An action's answer: the fragments it changed and what it did (or, without script,
    a page that says so)."""
    html = render("partials/notice.html", notice=notice, secret=secret)
    stamp(fragments, environment(request).store.last_event_seq())
    if request.headers.get("x-tether-fragment"):
        return JSONResponse({"fragments": fragments, "notice": html})
    return html_page(request, "message.html", "Done", text=notice + (f" Token: {secret}" if secret else ""))
