"""The directory of one environment's links: adding them, finding them by name, opening
each as a :class:`~tether.peers.peer.Peer` (or an A2A one), and which URLs a link may use.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

import httpx

from tether.a2a import available as a2a_available
from tether.domain.records import Link
from tether.errors import Conflict, Invalid, NotFound
from tether.peers.peer import Origin, Peer
from tether.store.base import OutboxRow


def check_url(url: str, insecure: bool) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Invalid(f"{url!r} is not an http(s) URL")
    if parts.scheme == "http" and not insecure and not _private(parts.hostname):
        raise Invalid(
            "plain http is accepted only for loopback and private addresses; use https or --insecure"
        )
    return url.rstrip("/")


def _private(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_private


class Peers:
    """All links of one environment."""

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self.peers: dict[str, Peer] = {}
        self._started = False

    async def start(self) -> None:
        self._started = True
        with self.origin.commands.view() as u:
            links = u.query(Link)
        for link in links:
            self._open(link)

    async def close(self) -> None:
        self._started = False
        for peer in list(self.peers.values()):
            await peer.close()
        self.peers.clear()

    def _open(self, link: Link) -> Peer:
        if link.kind == "a2a":
            from tether.peers.a2a import A2APeer  # needs the optional a2a-sdk

            peer: Peer = A2APeer(self.origin, link)
        else:
            peer = Peer(self.origin, link)
        self.peers[link.environment_id] = peer
        if self._started:
            peer.start()
        return peer

    def on_push(self, row: OutboxRow) -> None:
        """The ``peer.push`` side effect: a durable call for a peer was recorded."""
        peer = self.peers.get(row.payload.get("environmentId", ""))
        if peer is not None:
            peer.kick()

    def list(self) -> list[dict[str, Any]]:
        return [peer.view() for peer in self.peers.values()]

    def resolve(self, ref: str | None) -> Peer:
        """A linked environment by id, by its own name, or by the link's label."""
        if ref in self.peers:
            return self.peers[ref]
        found = [p for p in self.peers.values() if ref in (p.link.name, p.link.label)]
        if len(found) > 1:
            raise Conflict(f"{ref!r} names more than one linked environment; use its environmentId")
        if not found:
            raise NotFound(f"no linked environment {ref!r}")
        return found[0]

    async def add(
        self,
        url: str,
        token: str | None,
        label: str | None = None,
        insecure: bool = False,
        kind: str = "tether",
    ) -> dict[str, Any]:
        """Link to the tether environment at ``url`` (``kind`` "tether", with a token minted
        there) or to the A2A agent there (``kind`` "a2a", named by its card unless ``label``
        names it; its token, if it needs one, is sent as a Bearer token)."""
        url = check_url(url, insecure)
        if kind == "a2a":
            if not a2a_available():
                raise Invalid("A2A links need the a2a extra: pip install 'tether[a2a]'")
            from tether.peers.a2a import identity

            environment_id, name = await identity(url, token, label)
        elif kind == "tether" and token:
            environment_id, name = await self._identity(url, token)
        else:
            raise Invalid("a link to a tether environment needs a link token minted there (--token)")
        link = self.origin.commands.add_link(environment_id, name, url, token or "", label, kind)
        old = self.peers.pop(environment_id, None)
        if old is not None:
            await old.close()
        peer = self._open(link)
        return peer.view()

    async def _identity(self, url: str, token: str) -> tuple[str, str]:
        """The tether environment at ``url``: its id and name, once it took the token."""
        async with httpx.AsyncClient(timeout=5.0) as client:
            try:
                health = (await client.get(f"{url}/api/health")).json()
                environment_id, name = health["environmentId"], health["name"]
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                raise Invalid(f"{url} does not answer as a tether environment") from None
            if environment_id == self.origin.environment_id:
                raise Conflict("refusing to link this environment to itself")
            probe = await client.get(f"{url}/api/threads", headers={"Authorization": f"Bearer {token}"})
            if probe.status_code == 401:
                raise Invalid(f"{url} refused the token (unknown or revoked)")
        return environment_id, name
