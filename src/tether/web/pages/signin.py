"""Signing in and out (the admin token kept in the HttpOnly ``tether_token`` cookie), the
static files, and the ping the live connection uses."""

from __future__ import annotations

import hmac
import re
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    RedirectResponse,
    Response,
)

from tether.api.auth import environment
from tether.errors import NotFound
from tether.web.pages.common import (
    guard,
    html_page,
    read_form,
)

router = APIRouter(include_in_schema=False)
COOKIE = "tether_token"
STATIC = Path(__file__).parent.parent / "static"
_STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png", ".svg": "image/svg+xml"}


def _safe_next(target: str | None) -> str:
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


@router.get("/signin", response_class=HTMLResponse)
async def signin_form(request: Request, next: str = "/") -> HTMLResponse:
    return html_page(request, "signin.html", "Sign in", next=_safe_next(next), signed_in=False, page="signin")


@router.post("/signin")
async def signin(request: Request) -> Response:
    env = environment(request)
    form = await read_form(request)
    token = form.get("token", "").strip()
    target = _safe_next(form.get("next"))
    if not token or not hmac.compare_digest(token, env.admin_token):
        return html_page(
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
    guard(request)
    return Response(status_code=204)
