"""G10 for link tokens: a link token creates threads and acts only on what it created; it
cannot manage tokens or links; its event feed shows only its own threads; a revoked token
is refused at once and its holder shows the link as revoked; and work started through a
link cannot use the destination's own links (no transitive hops).

Three environments: alpha → beta (token t1), gamma → beta (token t3, revoked below),
beta → gamma (for the transitive hop); t2 is a second link token of beta used directly."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from linkkit import (
    assert_delivered_once,
    await_delivered,
    await_finished,
    await_on,
    first_run_done_with_command,
    parent_of,
    remote_child_started,
)

from kit import env_id, link, link_status, mint, new_thread, start_all, tasks_of, thread, wait_settled
from tether.launch import Server

REPLY = {"tether_script": 1, "rules": [{"on": "start", "do": [{"reply": "FINAL"}]}]}


def _as(server: Server, token: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _hop(environment: str) -> dict[str, Any]:
    """A script whose first run delegates onward to ``environment``."""
    return {"tether_script": 1, "rules": [{"on": "start", "do": [
        {"delegate": {"task": REPLY, "environment": environment, "id": "n"}}, {"reply": "hopped"}]}]}


@pytest.fixture(scope="module")
def world(module_servers: Any) -> dict[str, Any]:
    alpha, beta, gamma = module_servers("alpha"), module_servers("beta"), module_servers("gamma")
    start_all([alpha, beta, gamma])
    t1 = link(alpha, beta)
    t3 = link(gamma, beta)
    link(beta, gamma)
    t2 = mint(beta, "direct use")
    ids = {s.name: env_id(s) for s in (alpha, beta, gamma)}

    # on beta: a thread of the admin's with a local task, a remote child made through t1,
    # and a thread made through t2
    admin_thread = new_thread(beta, parent_of(REPLY, None), "admin's")
    wait_settled(beta, admin_thread)
    admin_task = tasks_of(beta, admin_thread)[0]["taskId"]

    alpha_parent = new_thread(alpha, parent_of(REPLY, "beta"), "alpha's parent")
    wait_settled(alpha, alpha_parent)
    t1_task = tasks_of(alpha, alpha_parent)[0]
    assert t1_task["result"]["text"] == "FINAL", t1_task

    t2_thread = new_thread(beta, REPLY, "t2's", token=t2["token"])
    wait_settled(beta, t2_thread)
    return {"alpha": alpha, "beta": beta, "gamma": gamma, "ids": ids, "t1": t1, "t2": t2, "t3": t3,
            "adminThread": admin_thread, "adminTask": admin_task,
            "t1Thread": t1_task["childThreadId"], "t1Task": t1_task["taskId"], "t2Thread": t2_thread}


def test_a_link_token_creates_threads_and_sees_only_its_own(world: dict[str, Any]) -> None:
    beta = world["beta"]
    with _as(beta, world["t2"]["token"]) as t2:
        listed = t2.get("/api/threads")
        assert listed.status_code == 200, listed.text
        mine = {t["threadId"] for t in listed.json()["threads"]}
        assert world["t2Thread"] in mine
        assert not mine & {world["adminThread"], world["t1Thread"]}
        own = t2.get(f"/api/threads/{world['t2Thread']}")
        assert own.status_code == 200
        assert own.json()["runs"][0]["reply"] == "FINAL"
        tasks = t2.get("/api/tasks")
        assert tasks.status_code == 200
        assert not {t["taskId"] for t in tasks.json()["tasks"]} & {world["adminTask"], world["t1Task"]}
    with _as(beta, world["t1"]["token"]) as t1:
        listed = {t["threadId"] for t in t1.get("/api/threads").json()["threads"]}
        assert world["t1Thread"] in listed
        assert not listed & {world["adminThread"], world["t2Thread"]}
        assert t1.get(f"/api/tasks/{world['t1Task']}").status_code == 200
    # the admin token reaches everything, including what peers created
    with beta.client() as admin:
        every = {t["threadId"] for t in admin.get("/api/threads").json()["threads"]}
        assert {world["adminThread"], world["t1Thread"], world["t2Thread"]} <= every
        assert admin.get(f"/api/threads/{world['t2Thread']}").status_code == 200


@pytest.mark.parametrize("whose", ["adminThread", "t1Thread"])
def test_a_link_token_cannot_touch_threads_it_did_not_create(world: dict[str, Any], whose: str) -> None:
    beta, thread_id = world["beta"], world[whose]
    before = thread(beta, thread_id)
    with _as(beta, world["t2"]["token"]) as t2:
        calls = {
            "read": t2.get(f"/api/threads/{thread_id}"),
            "read messages": t2.get(f"/api/threads/{thread_id}/messages"),
            "send": t2.post(f"/api/threads/{thread_id}/messages", json={"text": "hello"}),
            "interrupt": t2.post(f"/api/threads/{thread_id}/interrupt", json={"stop": True}),
            "wait": t2.get(f"/api/threads/{thread_id}/wait", params={"timeoutMs": 0}),
        }
        for what, response in calls.items():
            assert response.status_code in (403, 404), (what, response.status_code, response.text)
        credentials = t2.post(f"/api/threads/{thread_id}/credentials", json={})
        assert credentials.status_code in (403, 404), credentials.text
    assert thread(beta, thread_id) == before  # and nothing changed


@pytest.mark.parametrize("whose", ["adminTask", "t1Task"])
def test_a_link_token_cannot_touch_tasks_it_did_not_create(world: dict[str, Any], whose: str) -> None:
    beta, task_id = world["beta"], world[whose]
    with beta.client() as admin:
        before = admin.get(f"/api/tasks/{task_id}").json()
    with _as(beta, world["t2"]["token"]) as t2:
        assert t2.get(f"/api/tasks/{task_id}").status_code in (403, 404)
        cancel = t2.post(f"/api/tasks/{task_id}/cancel", json={"reason": "not mine"})
        assert cancel.status_code in (403, 404), cancel.text
        assert task_id not in {t["taskId"] for t in t2.get("/api/tasks").json()["tasks"]}
    with beta.client() as admin:
        assert admin.get(f"/api/tasks/{task_id}").json() == before


@pytest.mark.parametrize("action", [
    "send to the admin's thread", "send to t1's thread", "read the admin's task"])
def test_a_thread_a_link_token_created_stays_inside_the_fence(world: dict[str, Any], action: str) -> None:
    """The fence holds for the agent tools too: a thread made through t2 acts as t2."""
    beta = world["beta"]
    step = {
        "send to the admin's thread": {"thread_send": {"thread": world["adminThread"], "text": "hi"}},
        "send to t1's thread": {"thread_send": {"thread": world["t1Thread"], "text": "hi"}},
        "read the admin's task": {"task_status": world["adminTask"]},
    }[action]
    target = world["adminThread"] if "admin" in action else world["t1Thread"]
    before = thread(beta, target)
    script = {"tether_script": 1, "rules": [{"on": "start", "do": [step, {"reply": "reached it"}]}]}
    thread_id = new_thread(beta, script, "reach out", token=world["t2"]["token"])
    wait_settled(beta, thread_id)
    run = thread(beta, thread_id)["runs"][0]
    assert run["status"] == "failed", run
    assert run["reply"] != "reached it"
    assert thread(beta, target) == before


def test_a_link_token_cannot_manage_tokens_or_links(world: dict[str, Any]) -> None:
    beta, gamma = world["beta"], world["gamma"]
    with _as(beta, world["t2"]["token"]) as t2:
        assert t2.post("/api/link-tokens", json={"label": "more"}).status_code == 403
        assert t2.get("/api/link-tokens").status_code == 403
        assert t2.delete(f"/api/link-tokens/{world['t1']['tokenId']}").status_code == 403
        token = mint(gamma, "for beta again")["token"]
        assert t2.post("/api/links", json={"url": gamma.url, "token": token}).status_code == 403
        assert t2.get("/api/links").status_code == 403
    with _as(beta, world["t1"]["token"]) as t1:  # t1 was not revoked by that attempt
        assert t1.get("/api/threads").status_code == 200


def _feed(server: Server, token: str) -> list[dict[str, Any]]:
    """The whole stored feed as ``token`` sees it: read until the first keepalive, which
    the server sends only once it has caught up."""
    events: list[dict[str, Any]] = []
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.stream("GET", f"{server.url}/api/events", params={"after": "0", "keepalive": "0.2"},
                      headers=headers, timeout=30) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[5:]))
            elif line.startswith(": keepalive"):
                break
    return events


def test_a_link_tokens_feed_shows_only_its_own_threads(world: dict[str, Any]) -> None:
    beta = world["beta"]
    everything = _feed(beta, beta.token)
    assert world["adminThread"] in {e["threadId"] for e in everything}  # the filter is not vacuous
    for name in ("t2", "t1"):
        with _as(beta, world[name]["token"]) as client:
            own = {t["threadId"] for t in client.get("/api/threads").json()["threads"]}
        assert world[f"{name}Thread"] in own
        assert not own & {world["adminThread"], world["t1Thread" if name == "t2" else "t2Thread"]}
        seen = _feed(beta, world[name]["token"])
        assert seen, name
        assert {e["threadId"] for e in seen} <= own, (name, {e["threadId"] for e in seen} - own)
        assert world["adminTask"] not in {e["taskId"] for e in seen}


def test_a_revoked_token_is_refused_at_once_and_its_holder_shows_revoked(world: dict[str, Any]) -> None:
    beta, gamma, t3, ids = world["beta"], world["gamma"], world["t3"], world["ids"]
    with _as(beta, t3["token"]) as holder:
        assert holder.get("/api/threads").status_code == 200
    link_status(gamma, ids["beta"], lambda e: e["status"] == "ok", 10, "gamma's link to beta to be ok")

    with beta.client() as admin:
        revoked = admin.delete(f"/api/link-tokens/{t3['tokenId']}")
        assert revoked.status_code == 200, revoked.text
        assert revoked.json() == {"tokenId": t3["tokenId"], "revoked": True}

    with _as(beta, t3["token"]) as holder:
        calls = {
            "list threads": holder.get("/api/threads"),
            "create thread": holder.post("/api/threads", json={"provider": "script", "message": "{}"}),
            "list tasks": holder.get("/api/tasks"),
            "hand a task": holder.post("/api/tasks", json={
                "taskId": "tsk_after_revoke", "task": json.dumps(REPLY),
                "origin": {"environmentId": ids["gamma"], "threadId": "thr_x"}}),
            "events": holder.get("/api/events", params={"after": "now"}),
            "mcp": holder.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                               headers={"Accept": "application/json, text/event-stream"}),
        }
        for what, response in calls.items():
            assert response.status_code == 401, (what, response.status_code, response.text[:200])

    entry = link_status(gamma, ids["beta"], lambda e: e["status"] == "revoked", 10,
                        "gamma to show its link to beta as revoked")
    assert entry["lastError"]
    with beta.client() as admin:
        tokens = {t["tokenId"]: t for t in admin.get("/api/link-tokens").json()["tokens"]}
        assert tokens[t3["tokenId"]]["revoked"] is True
        assert tokens[world["t1"]["tokenId"]]["revoked"] is False

    # a delegation made meanwhile waits (it is not lost, nor run with the revoked token)...
    waiting_id = new_thread(gamma, parent_of(REPLY, "beta"), "while revoked")
    queued = await_on(gamma, lambda: tasks_of(gamma, waiting_id), 10, "the delegation to be recorded")
    assert queued[0]["status"] == "queued"
    with beta.client() as admin:
        threads = admin.get("/api/threads").json()["threads"]
    assert [t for t in threads if t["parentThreadId"] == waiting_id] == []

    # ...and it recovers: linked again with a new token, the waiting task goes through, and
    # gamma delegates to beta as before
    assert link(gamma, beta)["link"]["status"] == "ok"
    link_status(gamma, ids["beta"], lambda e: e["status"] == "ok", 10, "gamma's link to be ok again")
    tasks, parent = await_finished(gamma, waiting_id, 30)
    assert_delivered_once(tasks, parent)
    parent_id = new_thread(gamma, parent_of(REPLY, "beta"))
    wait_settled(gamma, parent_id)
    assert [t["result"]["text"] for t in tasks_of(gamma, parent_id)] == ["FINAL"]


def test_no_transitive_hop_from_a_remote_child(world: dict[str, Any]) -> None:
    """alpha → beta → gamma: the child alpha started on beta cannot use beta's link."""
    alpha, beta, gamma = world["alpha"], world["beta"], world["gamma"]
    with gamma.client() as admin:
        gamma_threads = {t["threadId"] for t in admin.get("/api/threads").json()["threads"]}
    parent_id = new_thread(alpha, parent_of(_hop("gamma"), "beta"), "hop through beta")
    wait_settled(alpha, parent_id)

    task = tasks_of(alpha, parent_id)[0]
    assert task["status"] == "failed", task
    child = thread(beta, task["childThreadId"])
    assert child["runs"][0]["status"] == "failed"
    assert "link" in (child["runs"][0]["error"] or ""), child["runs"][0]
    assert tasks_of(beta, task["childThreadId"]) == []
    with gamma.client() as admin:
        assert {t["threadId"] for t in admin.get("/api/threads").json()["threads"]} == gamma_threads


def test_no_transitive_hop_from_a_thread_a_link_token_created(world: dict[str, Any]) -> None:
    beta, gamma = world["beta"], world["gamma"]
    thread_id = new_thread(beta, _hop(world["ids"]["gamma"]), "hop", token=world["t2"]["token"])
    wait_settled(beta, thread_id)
    run = thread(beta, thread_id)["runs"][0]
    assert run["status"] == "failed", run
    assert "link" in (run["error"] or ""), run
    with gamma.client() as admin:
        made = [t for t in admin.get("/api/threads").json()["threads"] if t["title"] == "hop"]
        assert made == []


def test_a_task_open_when_its_token_is_revoked_does_not_wait_forever(
    world: dict[str, Any], tmp_path: Any
) -> None:
    """Runs last: it revokes alpha's token t1."""
    alpha, beta, ids = world["alpha"], world["beta"], world["ids"]
    gate = tmp_path / "gate"
    child = {"tether_script": 1, "rules": [
        {"on": "start", "do": [{"bash": f"while [ ! -e {gate} ]; do sleep 0.05; done; echo OK",
                                "background": True, "await": True}, {"reply": "WAITING"}]},
        {"on": "background_command", "do": [{"reply": "FINAL"}]}]}
    parent_id = new_thread(alpha, parent_of(child, "beta"), "in flight")
    child_id, _ = remote_child_started(alpha, beta, parent_id, first_run_done_with_command)

    with beta.client() as admin:
        assert admin.delete(f"/api/link-tokens/{world['t1']['tokenId']}").status_code == 200
    link_status(alpha, ids["beta"], lambda e: e["status"] == "revoked", 10, "alpha to show revoked")
    link(alpha, beta)  # the admins fix it: a new token
    gate.touch()
    await_on(beta, lambda: thread(beta, child_id)["settled"] and len(thread(beta, child_id)["runs"]) == 2,
             10, "the child to answer")

    # the parent must be told something: FINAL, or that its task ended
    tasks, _ = await_delivered(alpha, parent_id, 1, timeout=8)
    assert tasks[0]["status"] != "running"


def test_a_batch_of_tasks_is_answered_task_by_task(world: dict[str, Any]) -> None:
    """``POST /api/tasks/batch`` (how an origin pushes many new tasks at once) holds the
    same fence as ``POST /api/tasks``, task by task: new ones are created (asked again,
    answered as the first time), one of another token's is forbidden, one naming
    this environment as its origin is forbidden — and a refused one takes nothing from
    the others."""
    beta, ids = world["beta"], world["ids"]
    origin = {"environmentId": ids["alpha"], "threadId": "thr_batchparent"}
    new = ["tsk_batch0", "tsk_batch1"]
    tasks = [{"taskId": i, "task": json.dumps(REPLY), "origin": {**origin, "taskId": i}} for i in new]
    others = [
        {"taskId": world["t1Task"], "task": "x", "origin": origin},
        {"taskId": "tsk_batchself", "task": "x",
         "origin": {"environmentId": ids["beta"], "threadId": "thr_x"}},
    ]
    with _as(beta, world["t2"]["token"]) as t2:
        answered = t2.post("/api/tasks/batch", json={"tasks": [tasks[0], *others, tasks[1]]})
        assert answered.status_code == 200, answered.text
        results = answered.json()["results"]
        assert [(r["taskId"], r["status"]) for r in results] == [
            (new[0], 201), (world["t1Task"], 403), ("tsk_batchself", 403), (new[1], 201)]
        children = [results[0]["task"]["childThreadId"], results[3]["task"]["childThreadId"]]
        for child in children:
            assert wait_settled(beta, child)["settled"]
        again = t2.post("/api/tasks/batch", json={"tasks": tasks}).json()["results"]
        assert [r["task"]["childThreadId"] for r in again] == children  # asked again: the first (G9)
        assert t2.get("/api/tasks/tsk_batchself").status_code == 404
        too_many = t2.post("/api/tasks/batch", json={"tasks": [tasks[0]] * 51})
        assert too_many.status_code == 422
    with beta.client() as admin:  # only a link token hands tasks over
        refused = admin.post("/api/tasks/batch", json={"tasks": [{**tasks[0], "taskId": "tsk_batchadmin"}]})
        assert [r["status"] for r in refused.json()["results"]] == [403]
        assert admin.get("/api/tasks/tsk_batchadmin").status_code == 404
        assert {admin.get(f"/api/tasks/{i}").json()["status"] for i in new} == {"completed"}
