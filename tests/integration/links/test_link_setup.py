"""Linking environments (SPEC §6, §4 link endpoints): what ``POST /api/links`` refuses, how
links are listed, how an environment is named in a delegation, that links survive a
restart, and the ``tether token`` / ``tether link`` commands."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from linkkit import assert_delivered_once, await_finished, cli, parent_of, read_link_row

from kit import env_id, link, link_status, links, mint, new_thread, start_all, tasks_of, thread, wait_settled
from tether.launch import Server, free_port
from tether.probes import parent_script

DONE = {"tether_script": 1, "rules": [{"on": "start", "do": [{"reply": "FINAL"}]}]}


class NotTether(BaseHTTPRequestHandler):
    """A plain web server: HTML everywhere, and a JSON health answer that is not tether's."""

    def do_GET(self) -> None:
        if self.path.startswith("/api/health"):
            body, kind = json.dumps({"status": "ok"}).encode(), "application/json"
        else:
            body, kind = b"<html><body>hello</body></html>", "text/html"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def plain_http() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), NotTether)
    worker = threading.Thread(target=server.serve_forever, daemon=True)
    worker.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def envs(module_servers: Any) -> dict[str, Any]:
    """origin → peer (label ``lab-peer``) and origin → third (label ``peer``: the name
    ``peer`` is then ambiguous on the origin)."""
    origin, peer, third = module_servers("origin"), module_servers("peer"), module_servers("third")
    start_all([origin, peer, third])
    made = link(origin, peer, label="lab-peer")["link"]
    link(origin, third, label="peer")
    return {"origin": origin, "peer": peer, "third": third, "made": made,
            "ids": {s.name: env_id(s) for s in (origin, peer, third)}}


def _post_link(origin: Server, body: dict[str, Any]) -> Any:
    with origin.client() as client:
        return client.post("/api/links", json=body)


def _error(response: Any) -> str:
    body = response.json()
    assert set(body["error"]) >= {"code", "message"}, body
    return str(body["error"]["message"])


def test_refuses_a_url_nothing_listens_on(envs: dict[str, Any]) -> None:
    origin, peer = envs["origin"], envs["peer"]
    before = links(origin)
    token = mint(peer, "dead port")["token"]
    response = _post_link(origin, {"url": f"http://127.0.0.1:{free_port()}", "token": token})
    assert 400 <= response.status_code < 500, response.text
    assert "tether" in _error(response)
    assert links(origin) == before


def test_refuses_a_plain_http_server(envs: dict[str, Any], plain_http: str) -> None:
    origin, peer = envs["origin"], envs["peer"]
    before = links(origin)
    token = mint(peer, "plain http")["token"]
    response = _post_link(origin, {"url": plain_http, "token": token})
    assert 400 <= response.status_code < 500, response.text
    assert "tether" in _error(response)
    assert links(origin) == before


def test_refuses_linking_to_itself(envs: dict[str, Any]) -> None:
    origin = envs["origin"]
    before = links(origin)
    token = mint(origin, "myself")["token"]
    for url in (origin.url, origin.url.replace("127.0.0.1", "localhost")):
        response = _post_link(origin, {"url": url, "token": token})
        assert response.status_code in (400, 409, 422), response.text
        assert "itself" in _error(response)
    assert links(origin) == before


def test_refuses_a_bad_token(envs: dict[str, Any]) -> None:
    origin, peer = envs["origin"], envs["peer"]
    before = links(origin)
    for token in ("ttl_not-a-token-anyone-minted", peer.token + "x"):
        response = _post_link(origin, {"url": peer.url, "token": token})
        assert 400 <= response.status_code < 500, response.text
        assert "token" in _error(response)
    assert links(origin) == before


def test_a_link_is_listed_with_status_ok(envs: dict[str, Any]) -> None:
    origin, peer, ids, made = envs["origin"], envs["peer"], envs["ids"], envs["made"]
    assert made["environmentId"] == ids["peer"]
    assert made["name"] == "peer"
    assert made["status"] == "ok"

    listed = {entry["environmentId"]: entry for entry in links(origin)}
    assert set(listed) == {ids["peer"], ids["third"]}
    entry = listed[ids["peer"]]
    assert entry["name"] == "peer"
    assert entry["label"] == "lab-peer"
    assert entry["url"].rstrip("/") == peer.url
    assert entry["status"] == "ok"
    assert entry["lastError"] is None
    assert listed[ids["third"]]["label"] == "peer"


@pytest.mark.parametrize(("ref", "target"), [
    ("id:peer", "peer"), ("lab-peer", "peer"), ("third", "third"), ("id:third", "third"),
])
def test_a_delegation_names_the_environment_by_id_name_or_label(
    envs: dict[str, Any], ref: str, target: str
) -> None:
    origin, ids = envs["origin"], envs["ids"]
    environment = ids[ref[3:]] if ref.startswith("id:") else ref
    parent_id = new_thread(origin, parent_of(DONE, environment))
    wait_settled(origin, parent_id)
    tasks = tasks_of(origin, parent_id)
    assert len(tasks) == 1
    assert tasks[0]["childEnvironmentId"] == ids[target]
    assert tasks[0]["result"]["text"] == "FINAL"
    child = thread(envs[target], tasks[0]["childThreadId"])
    assert child["parentThreadId"] == parent_id


@pytest.mark.parametrize(("ref", "words"), [
    ("nowhere", ["no linked environment", "nowhere"]),
    ("peer", ["more than one"]),  # the peer's own name, and the label of the link to third
])
def test_an_unknown_or_ambiguous_environment_fails_the_delegate_clearly(
    envs: dict[str, Any], ref: str, words: list[str]
) -> None:
    origin = envs["origin"]
    parent_id = new_thread(origin, parent_of(DONE, ref))
    wait_settled(origin, parent_id)
    parent = thread(origin, parent_id)
    first = parent["runs"][0]
    assert first["status"] == "failed", first
    for word in words:
        assert word in (first["error"] or ""), first
    assert tasks_of(origin, parent_id) == []


def test_the_listed_cursor_is_the_stored_one(envs: dict[str, Any]) -> None:
    origin, ids = envs["origin"], envs["ids"]
    parent_id = new_thread(origin, parent_of(DONE, "lab-peer"))
    wait_settled(origin, parent_id)  # its result came through the feed: the cursor moved
    stored = read_link_row(origin.data / "tether.db", ids["peer"])["cursor"]
    assert stored is not None
    listed = next(e for e in links(origin) if e["environmentId"] == ids["peer"])
    assert listed["cursor"] == stored


def test_links_survive_an_origin_restart(envs: dict[str, Any]) -> None:
    origin, peer, ids = envs["origin"], envs["peer"], envs["ids"]
    before = {entry["environmentId"]: entry for entry in links(origin)}
    origin.stop()
    origin.start()

    after = {entry["environmentId"]: entry for entry in links(origin)}
    assert set(after) == {ids["peer"], ids["third"]}
    for environment_id, entry in after.items():
        for field in ("name", "label", "url"):
            assert entry[field] == before[environment_id][field]
    link_status(origin, ids["peer"], lambda entry: entry["status"] == "ok", 10, "the link to be ok again")
    parent_id = new_thread(origin, parent_script(3, "lab-peer", 0.3))
    tasks, parent = await_finished(origin, parent_id)
    assert_delivered_once(tasks, parent)
    assert tasks[0]["childEnvironmentId"] == ids["peer"]
    assert thread(peer, tasks[0]["childThreadId"])["parentThreadId"] == parent_id


def test_cli_token_and_link_commands(envs: dict[str, Any]) -> None:
    """``tether token create|list|revoke`` and ``tether link add|list``, as a user types them."""
    peer, third, ids = envs["peer"], envs["third"], envs["ids"]
    at_peer = ["--url", peer.url, "--token", peer.token]

    created = cli("token", "create", "--label", "x", "--json", *at_peer)
    assert created.returncode == 0, created.stderr
    minted = json.loads(created.stdout)
    assert minted["tokenId"] and minted["token"]

    listed = cli("token", "list", "--json", *at_peer)
    assert listed.returncode == 0, listed.stderr
    assert minted["token"] not in listed.stdout  # shown once, stored hashed
    ours = [t for t in json.loads(listed.stdout)["tokens"] if t["tokenId"] == minted["tokenId"]]
    assert len(ours) == 1
    assert ours[0]["label"] == "x"
    assert ours[0]["revoked"] is False

    added = cli("link", "add", peer.url, "--token", minted["token"], "--json",
                "--url", third.url, "--admin-token", third.token)
    assert added.returncode == 0, added.stderr
    made = json.loads(added.stdout)
    assert made["environmentId"] == ids["peer"]
    assert made["name"] == "peer"
    assert made["status"] == "ok"

    shown = cli("link", "list", "--json", "--url", third.url, "--token", third.token)
    assert shown.returncode == 0, shown.stderr
    entries = [e for e in json.loads(shown.stdout)["links"] if e["environmentId"] == ids["peer"]]
    assert len(entries) == 1
    assert entries[0]["status"] == "ok"

    refused = cli("link", "add", f"http://127.0.0.1:{free_port()}", "--token", minted["token"], "--json",
                  "--url", third.url, "--admin-token", third.token)
    assert refused.returncode != 0
    assert "tether" in refused.stderr

    revoked = cli("token", "revoke", minted["tokenId"], *at_peer)
    assert revoked.returncode == 0, revoked.stderr
    after = cli("token", "list", "--json", *at_peer)
    ours = [t for t in json.loads(after.stdout)["tokens"] if t["tokenId"] == minted["tokenId"]]
    assert ours[0]["revoked"] is True
