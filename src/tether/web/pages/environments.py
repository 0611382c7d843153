"""The environments page: links with their live state, and link tokens (minted, shown
once, revoked)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import (
    HTMLResponse,
    Response,
)

from tether import __version__
from tether.api.auth import environment
from tether.engine.tokens import token_view
from tether.environment import Environment
from tether.errors import Invalid, TetherError
from tether.web import remote
from tether.web.pages.common import (
    action_answer,
    guard,
    html_page,
    read_form,
    signed_in,
    to_signin,
)
from tether.web.pages.threads import env_summary
from tether.web.render import fragment as make_fragment

router = APIRouter(include_in_schema=False)
#: How often the environments page looks at its links' own state (reachability, last
#: error, cursor: kept by each link's follower), whatever the event feed does.
LINK_WATCH = 0.5
#: How often it re-measures each link's cursor lag (a read of the peer's feed) unchanged.
LAG_REFRESH = 10.0


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
        return to_signin(request)
    env = environment(request)
    cursor = env.store.last_event_seq()
    summary = env_summary(env)
    return html_page(
        request,
        "environments.html",
        "Environments",
        page="environments",
        links=await _links(env),
        tokens=[token_view(t) for t in env.tokens.list()],
        counts=summary,
        base_url=env.base_url,
        version=__version__,
        cursor=cursor,
        live="/ui/live?view=environments",
    )


@router.post("/ui/link-tokens")
async def create_link_token(request: Request) -> Response:
    env = guard(request)
    form = await read_form(request)
    label = form.get("label", "").strip()
    if not label or len(label) > 200:
        raise Invalid("a link token needs a label of 1 to 200 characters")
    record, secret = env.tokens.mint(label)
    notice = f"Link token “{label}” created. Copy it now: it is not shown again."
    return action_answer(request, [_token_fragment(token_view(record))], notice, secret=secret)


@router.post("/ui/link-tokens/{token_id}/revoke")
async def revoke_link_token(request: Request, token_id: str) -> Response:
    env = guard(request)
    record = env.tokens.revoke(token_id)
    return action_answer(
        request,
        [_token_fragment(token_view(record))],
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
    env = guard(request)
    form = await read_form(request)
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
    return action_answer(request, [_link_fragment(link)], f"Linked to {view['name']} ({view['status']}).")
