"""Links between environments, as a user makes them: a token minted by the peer, added
on the origin."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kit.waits import poll
from tether.launch import Server


def mint(peer: Server, label: str) -> dict[str, Any]:
    """A link token minted by ``peer``: ``{tokenId, token, ...}``."""
    with peer.client() as client:
        response = client.post("/api/link-tokens", json={"label": label})
    assert response.status_code == 201, response.text
    return dict(response.json())


def link(origin: Server, peer: Server, label: str | None = None, url: str | None = None) -> dict[str, Any]:
    """Link ``origin`` → ``peer`` (or → ``url``, e.g. a proxy in front of the peer) with a
    fresh token minted by the peer. Returns the token and the link as the origin shows it."""
    token = mint(peer, f"for {origin.name}")
    body: dict[str, Any] = {"url": url or peer.url, "token": token["token"]}
    if label is not None:
        body["label"] = label
    with origin.client() as client:
        response = client.post("/api/links", json=body)
    assert response.status_code in (200, 201), response.text
    return {**token, "link": response.json()}


def links(server: Server) -> list[dict[str, Any]]:
    with server.client() as client:
        response = client.get("/api/links")
    assert response.status_code == 200, response.text
    return list(response.json()["links"])


def link_status(
    origin: Server, environment_id: str, wanted: Callable[[dict[str, Any]], bool], timeout: float, what: str
) -> dict[str, Any]:
    """Poll the origin's ``GET /api/links`` until the link to ``environment_id`` matches
    (a bounded poll: tests read the status, not the feed's ``link.status`` events)."""

    def check() -> dict[str, Any] | None:
        found = next((entry for entry in links(origin) if entry["environmentId"] == environment_id), None)
        return found if found is not None and wanted(found) else None

    return poll(check, timeout, what)
