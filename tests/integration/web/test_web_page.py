"""SPEC §10 in a real browser: two linked ``tether serve`` processes and Debian's headless
Chromium. Sign in; probe 1 with a remote child, watched from the parent's page (working →
waiting → settled only once FINAL arrived, the follow-up and its wake in the ledger);
cancelling a task from the page; dropping and restoring the live connection mid-run with
nothing missed and nothing doubled. Screenshots of the main views go to docs/screenshots/.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from webkit import api, await_view, health, open_page, screenshot, unique_ids
from webkit import (
    expect as webkit_expect,
)

from kit import new_thread, thread, wait_settled
from tether.launch import Server
from tether.probes import child_script

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


# ---------------------------------------------------------------------- access (no browser)


def test_everything_but_signin_and_static_needs_the_token(pair: dict[str, Server]) -> None:
    alpha = pair["alpha"]
    for path in ("/", "/environments", "/threads/thr_x", "/env/env_x/threads/thr_x"):
        response = httpx.get(alpha.url + path, follow_redirects=False, timeout=5)
        assert response.status_code == 303 and response.headers["location"].startswith("/signin"), path
    assert httpx.get(alpha.url + "/signin", timeout=5).status_code == 200
    assert httpx.get(alpha.url + "/static/tether.js", timeout=5).status_code == 200
    assert httpx.get(alpha.url + "/static/tether.css", timeout=5).status_code == 200
    assert httpx.get(alpha.url + "/ui/live", timeout=5).status_code == 401
    assert httpx.post(alpha.url + "/ui/tasks/tsk_x/cancel", timeout=5).status_code == 401
    wrong = httpx.post(alpha.url + "/signin", data={"token": "tta_wrong"}, timeout=5)
    assert wrong.status_code == 401 and "not this environment" in wrong.text
    right = httpx.post(alpha.url + "/signin", data={"token": alpha.token, "next": "/environments"}, timeout=5)
    assert right.status_code == 303 and right.headers["location"] == "/environments"
    cookie = right.headers["set-cookie"]
    assert "tether_token=" in cookie and "HttpOnly" in cookie
    signed = httpx.get(alpha.url + "/", cookies={"tether_token": alpha.token}, timeout=5)
    assert signed.status_code == 200 and "Threads" in signed.text
    # another site's form cannot act with the cookie
    refused = httpx.post(
        alpha.url + "/ui/link-tokens",
        data={"label": "x"},
        cookies={"tether_token": alpha.token},
        headers={"Origin": "http://evil.example"},
        timeout=5,
    )
    assert refused.status_code == 403


def test_stopping_an_unknown_item_is_a_404_that_changes_nothing(pair: dict[str, Server]) -> None:
    alpha = pair["alpha"]
    script = {"tether_script": 1, "rules": [{"on": "start", "do": [{"reply": "hi"}]}]}
    thread_id = new_thread(alpha, script, "no items")
    before = thread(alpha, thread_id)
    with alpha.client() as client:
        missing = client.post(f"/api/threads/{thread_id}/items/bg_nope/stop")
        no_thread = client.post("/api/threads/thr_nope/items/bg_nope/stop")
    assert missing.status_code == 404 and "bg_nope" in missing.json()["error"]["message"]
    assert no_thread.status_code == 404
    after = thread(alpha, thread_id)
    assert (after["runs"], after["background"]) == (before["runs"], before["background"])


# ---------------------------------------------------------------------- probe 1, remote child


def _probe_1_parent(environment: str, seconds: float) -> dict[str, Any]:
    """The parent of probe 1 (SPEC §8), its runs slowed a little so a person can see them."""
    delegate = {"task": child_script(1, seconds), "id": "c", "title": "probe 1", "environment": environment}
    return {
        "tether_script": 1,
        "rules": [
            {"on": "start", "do": [{"delegate": delegate}, {"sleep_ms": 1500}, {"reply": "delegated"}]},
            {"on": "delegated_task", "repeat": True, "do": [{"sleep_ms": 400}, {"reply": "got {{text}}"}]},
        ],
    }


_WATCH = """([headId, ledgerId]) => {
  window.__states = [];
  const note = () => {
    const head = document.getElementById(headId);
    if (!head) return;
    const state = [...head.classList].find(c => c.startsWith('att-')).slice(4);
    const ledger = document.getElementById(ledgerId);
    const final = !!ledger && [...ledger.querySelectorAll('tr.how-follow-up')]
      .some(tr => tr.textContent.includes('FINAL'));
    const last = window.__states[window.__states.length - 1];
    if (!last || last.state !== state) window.__states.push({state, final});
  };
  note();
  new MutationObserver(note).observe(document.getElementById('main'), {childList: true, subtree: true});
}"""


def test_remote_probe_1_seen_live(page: Any, pair: dict[str, Server]) -> None:
    expect = webkit_expect()
    alpha, beta = pair["alpha"], pair["beta"]
    beta_id = health(beta)["environmentId"]
    parent = new_thread(alpha, _probe_1_parent("beta", 3.0), "probe 1 (remote child)")
    page.goto(f"{alpha.url}/threads/{parent}")
    page.evaluate(_WATCH, [f"head-{parent}", f"ledger-{parent}"])
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    expect(page.locator(f"#head-{parent}")).to_have_class(re.compile(r"\batt-waiting\b"))
    card = page.locator("li.task-card").first
    expect(card).to_contain_text("in beta (linked)")
    expect(card.get_by_role("link", name="child thread")).to_have_attribute(
        "href", re.compile(rf"^/env/{beta_id}/threads/thr_")
    )
    screenshot(page, "thread-waiting.png")
    expect(page.locator(f"#head-{parent}")).to_have_class(re.compile(r"\batt-settled\b"))
    states = page.evaluate("window.__states")
    names = [s["state"] for s in states]
    assert names[0] == "working" and "waiting" in names, names
    assert names[-1] == "settled" and "settled" not in names[:-1], names  # never settled early
    assert states[-1]["final"], states  # settled only once FINAL had reached the ledger

    view = thread(alpha, parent)
    assert view["attention"] == "settled"
    root, follow_up = view["ledger"]
    assert (root["reachedAs"], root["resultText"], follow_up["reachedAs"], follow_up["resultText"]) == (
        "result",
        "WAITING",
        "follow-up",
        "FINAL",
    )
    ledger = page.locator(f"#ledger-{parent} tr")
    expect(ledger).to_have_count(2)
    expect(ledger.nth(0)).to_contain_text("as the result")
    expect(ledger.nth(0)).to_contain_text(f"woke run #{root['wake']['runSeq']}")
    expect(ledger.nth(1)).to_contain_text("as a follow-up")
    expect(ledger.nth(1)).to_contain_text(f"woke run #{follow_up['wake']['runSeq']}")
    expect(ledger.nth(1)).to_contain_text("FINAL")
    # the timeline: one entry per run, the wakes labelled, nothing doubled
    expect(page.locator(f"#timeline-{parent} > li.run")).to_have_count(len(view["runs"]))
    timeline = page.locator(f"#timeline-{parent}")
    expect(timeline).to_contain_text("woken: follow-up of task “probe 1” completed")
    expect(page.locator("li.task-card").first).to_contain_text("FINAL")
    assert unique_ids(page) == []
    page.locator("details.fold").first.locator("summary").click()  # a fold opens
    screenshot(page, "thread.png")

    # the child, on the other environment, through this server
    page.locator("li.task-card").first.get_by_role("link", name="child thread").click()
    expect(page.locator("header.threadhead")).to_contain_text("beta")
    expect(page.locator("ol.timeline")).to_contain_text("woken: command `sleep 3.0; echo OK` exited 0")
    expect(page.locator("ol.timeline")).to_contain_text("FINAL")
    screenshot(page, "remote-child.png")

    page.goto(alpha.url + "/")
    expect(page.locator("#group-settled")).to_contain_text("probe 1 (remote child)")
    screenshot(page, "threads.png")


# ---------------------------------------------------------------------- steering


def test_cancel_a_task_from_the_page(page: Any, pair: dict[str, Server]) -> None:
    expect = webkit_expect()
    alpha = pair["alpha"]
    child = {
        "tether_script": 1,
        "rules": [
            {
                "on": "start",
                "do": [
                    {"bash": "sleep 60", "background": True, "id": "long", "await": True},
                    {"reply": "WORKING ON IT"},
                ],
            },
            {"on": "background_command", "do": [{"reply": "FINAL"}]},
        ],
    }
    parent_script = {
        "tether_script": 1,
        "rules": [
            {
                "on": "start",
                "do": [{"delegate": {"task": child, "id": "c", "title": "long job"}}, {"reply": "delegated"}],
            },
            {"on": "delegated_task", "repeat": True, "do": [{"reply": "got {{text}}"}]},
        ],
    }
    parent = new_thread(alpha, parent_script, "cancel me")
    await_view(
        alpha,
        parent,
        lambda v: v["tasks"] and v["tasks"][0]["interim"] == "WORKING ON IT",
        "the child's first answer",
    )
    page.goto(f"{alpha.url}/threads/{parent}")
    card = page.locator("li.task-card").first
    expect(page.locator(f"#background-{parent}")).to_contain_text("long job")
    card.get_by_role("button", name="Cancel task long job").click()
    notice = page.locator("li.task-card + li.notice-slot")  # right under the card
    expect(notice).to_contain_text("Cancelled task “long job”")
    expect(notice).to_contain_text("stopped command “sleep 60”")  # it says what it stopped
    expect(card).to_have_class(re.compile(r"\bst-cancelled\b"))
    expect(page.locator(f"#ledger-{parent} tr").first).to_contain_text("cancelled")
    wait_settled(alpha, parent)
    view = thread(alpha, parent)
    wakes = [r for r in view["runs"] if r["trigger"]["kind"] == "delegated_task"]
    assert len(wakes) == 1 and view["tasks"][0]["status"] == "cancelled", view["runs"]
    expect(page.locator(f"#head-{parent}")).to_have_class(re.compile(r"\batt-settled\b"))
    expect(page.locator(f"#ledger-{parent} tr").first).to_contain_text(f"woke run #{len(view['runs'])}")


def test_send_and_stop_say_what_they_stopped(page: Any, pair: dict[str, Server]) -> None:
    expect = webkit_expect()
    alpha = pair["alpha"]
    script = {
        "tether_script": 1,
        "rules": [
            {
                "on": "start",
                "do": [
                    {"monitor": "sleep 60", "persistent": True, "id": "mon"},
                    {"sleep_ms": 30000},
                ],
            },
            {"on": "user", "repeat": True, "do": [{"reply": "heard {{text}}"}]},
        ],
    }
    thread_id = new_thread(alpha, script, "steer me")
    page.goto(f"{alpha.url}/threads/{thread_id}")
    expect(page.locator(f"#head-{thread_id}")).to_have_class(re.compile(r"\batt-working\b"))
    page.get_by_label("Message to this thread").fill("change of plan")
    page.get_by_label("Start now (stops the running run)").check()
    page.get_by_role("button", name="Send").click()
    expect(page.locator("form.send + .notice-slot")).to_contain_text("to start it now, stopped run #1")
    expect(page.locator(f"#timeline-{thread_id}")).to_contain_text("heard change of plan")
    first = page.locator(f"#timeline-{thread_id} > li.run").first
    expect(first).to_have_class(re.compile(r"\bstate-stopped\b"))  # stopped on purpose:
    expect(first.locator(".msg.error")).to_have_count(0)  # not a red error box
    expect(page.locator(f"#background-{thread_id} li").first).to_contain_text("sleep 60")
    row = page.locator("#" + str(page.locator(f"#background-{thread_id} li").first.get_attribute("id")))
    row.get_by_role("button", name=re.compile("^Stop monitor")).click()
    expect(page.locator("li.item + li.notice-slot")).to_contain_text("Stopped monitor “sleep 60”")
    expect(row).to_have_class(re.compile(r"\bst-cancelled\b"))
    expect(page.locator(f"#background-ended-{thread_id}")).to_contain_text("sleep 60")  # it left the list
    page.get_by_role("button", name="Stop the running run of this thread").click()
    said = re.compile("stopped run #|nothing was running", re.IGNORECASE)
    expect(page.locator(".stops form + .notice-slot")).to_contain_text(said)


_SLOW_THEN_HEAR = {
    "tether_script": 1,
    "rules": [
        {"on": "start", "do": [{"sleep_ms": 30000}]},
        {"on": "delegated_task", "do": [{"sleep_ms": 30000}]},
        {"on": "user", "repeat": True, "do": [{"reply": "heard {{text}}"}]},
    ],
}


def _busy_thread(pair: dict[str, Server], where: str) -> tuple[Server, str]:
    """A thread busy with a long first run: here, or in beta as alpha's delegated child
    (alpha's link token sees only the threads it created there)."""
    alpha, beta = pair["alpha"], pair["beta"]
    if where == "local":
        return alpha, new_thread(alpha, _SLOW_THEN_HEAR, "start now")
    delegate = {"task": _SLOW_THEN_HEAR, "environment": "beta", "title": "start now"}
    delegating = {"tether_script": 1, "rules": [{"on": "start", "do": [{"delegate": delegate}]}]}
    parent = new_thread(alpha, delegating, "delegates a slow child")
    view = await_view(alpha, parent, lambda v: v["tasks"] and v["tasks"][0]["childThreadId"], "the child")
    return beta, view["tasks"][0]["childThreadId"]


@pytest.mark.parametrize("where", ["local", "linked"])
def test_start_now_starts_before_an_earlier_queued_message(pair: dict[str, Server], where: str) -> None:
    """The page's "start now" stops the running run and goes ahead of an earlier queued
    message — on a thread here, and on a linked environment's thread seen from here."""
    alpha, beta = pair["alpha"], pair["beta"]
    home, thread_id = _busy_thread(pair, where)
    await_view(home, thread_id, lambda v: v["runs"][0]["status"] == "running", "the first run")
    api(home, "POST", f"/api/threads/{thread_id}/messages", json={"text": "later", "mode": "queue"})
    here = "" if where == "local" else f"/env/{health(beta)['environmentId']}"
    sent = httpx.post(
        f"{alpha.url}/ui{here}/threads/{thread_id}/message",
        data={"text": "urgent", "when": "now"},
        cookies={"tether_token": alpha.token},
        headers={"X-Tether-Fragment": "1"},
        timeout=10,
    )
    assert sent.status_code == 200
    assert "to start it now, stopped run #1" in sent.text
    wait_settled(home, thread_id)
    view = thread(home, thread_id)
    assert view["runs"][0]["status"] == "interrupted"
    # The order the replies were written in (message positions), not the runs' start times:
    # two instant runs can start within one millisecond, and a tie would hide the order.
    said = sorted((m for m in view["messages"] if m["role"] == "assistant"), key=lambda m: m["position"])
    assert [m["text"] for m in said] == ["heard urgent", "heard later"], said


# ---------------------------------------------------------------------- the live connection


def test_drop_and_restore_misses_and_doubles_nothing(page: Any, pair: dict[str, Server]) -> None:
    expect = webkit_expect()
    alpha = pair["alpha"]
    lines = "for i in 1 2 3 4 5; do sleep 0.3; echo line$i; done"
    script = {
        "tether_script": 1,
        "rules": [
            {"on": "start", "do": [{"monitor": lines, "id": "m"}, {"reply": "WATCHING"}]},
            {"on": "monitor_event", "repeat": True, "do": [{"sleep_ms": 150}, {"reply": "PROGRESS"}]},
            {"on": "monitor_finished", "do": [{"reply": "DONE"}]},
        ],
    }
    thread_id = new_thread(alpha, script, "watch a monitor")
    page.goto(f"{alpha.url}/threads/{thread_id}")
    status = page.locator("#live-status")
    expect(status).to_have_attribute("data-state", "live")
    expect(page.locator(f"#timeline-{thread_id} > li.run").first).to_be_visible()
    page.evaluate("window.tetherLive.drop()")
    expect(status).to_have_attribute("data-state", "reconnecting")
    expect(status).to_have_text("disconnected")
    seen_while_down = page.locator(f"#timeline-{thread_id}").inner_text()
    wait_settled(alpha, thread_id)
    view = thread(alpha, thread_id)
    answers = [r for r in view["runs"] if r["trigger"]["kind"] != "monitor_event"]
    progress = [r for r in view["runs"] if r["trigger"]["kind"] == "monitor_event"]
    assert progress and "printed 5 lines" not in seen_while_down  # the page missed lines while down
    page.evaluate("window.tetherLive.restore()")
    expect(status).to_have_attribute("data-state", "live")
    runs = page.locator(f"#timeline-{thread_id} > li.run")
    expect(runs).to_have_count(len(answers))
    expect(page.locator(f"#head-{thread_id}")).to_have_class(re.compile(r"\batt-settled\b"))
    ids = [f"run-{r['runId']}" for r in answers]
    assert [runs.nth(n).get_attribute("id") for n in range(len(ids))] == ids
    # the progress runs are one group, with every line
    group = page.locator(f"#timeline-{thread_id} > li.monitor-group")
    expect(group).to_have_count(1)
    expect(group).to_contain_text("printed 5 lines")
    expect(group).to_contain_text(f"{len(progress)} progress run")
    stale = page.locator(f"#timeline-{thread_id} li.st-running, #timeline-{thread_id} li.st-queued")
    assert stale.count() == 0
    expect(page.locator(f"#timeline-{thread_id}")).to_contain_text("DONE")
    # a replay of the whole feed (a reconnect from the start) doubles nothing
    reached = int(page.evaluate("window.tetherLive.cursor"))
    page.evaluate("window.tetherLive.restore(0)")
    expect(status).to_have_attribute("data-state", "live")
    page.wait_for_function(f"Number(window.tetherLive.cursor) >= {reached}")
    expect(runs).to_have_count(len(answers))
    expect(group).to_have_count(1)
    assert unique_ids(page) == []


def test_environments_page(page: Any, pair: dict[str, Server]) -> None:
    expect = webkit_expect()
    alpha, beta = pair["alpha"], pair["beta"]
    beta_id = health(beta)["environmentId"]
    page.goto(alpha.url + "/environments")
    row = page.locator(f"#link-{beta_id}")
    expect(row).to_contain_text("beta")
    expect(row).to_contain_text("ok")
    expect(row).to_contain_text("0 events behind")
    label = page.get_by_label("Label (who will use it)")
    label.fill("laptop")
    page.get_by_role("button", name="Create link token").click()
    # the shown-once token appears right under the form that made it, in view
    secret = page.locator("form[action='/ui/link-tokens'] + .notice-slot").get_by_label(
        "Link token (shown once)"
    )
    expect(secret).to_have_value(re.compile(r"^ttl_"))
    expect(secret).to_be_in_viewport()
    expect(label).to_have_value("")  # not an invitation to mint a second one
    expect(page.locator("#tokens")).to_contain_text("laptop")
    screenshot(page, "environments.png")
    # errors in the page's words, not the command line's
    page.get_by_label("URL of the other environment").fill("http://example.com:8765")
    page.get_by_label("Link token minted there").fill("ttl_x")
    page.get_by_role("button", name="Add link").click()
    refused = page.locator("form[action='/ui/links'] + .notice-slot")
    expect(refused).to_contain_text("Allow plain http to a public address")
    expect(refused).not_to_contain_text("--insecure")


@pytest.mark.parametrize("path", ["/", "/environments", "fleet"])
def test_a_phone_shows_everything(browser: Any, pair: dict[str, Server], path: str) -> None:
    """390 px wide: nothing runs off the screen (the ledger's Wake and Answer, the links'
    columns), and the page does not scroll sideways."""
    expect = webkit_expect()
    alpha = pair["alpha"]
    phone, errors = open_page(browser, alpha, width=390, height=800)
    if path == "fleet":
        parent = new_thread(alpha, _probe_1_parent("beta", 0.5), "phone parent")
        wait_settled(alpha, parent)
        path = f"/threads/{parent}"
    phone.goto(alpha.url + path)
    expect(phone.locator("h1").first).to_be_visible()
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    cells = phone.locator("main td, main button, main input, main a")
    offscreen = cells.evaluate_all(
        """(els) => els.filter(e => { const r = e.getBoundingClientRect();
             return r.width > 0 && (r.right > 391 || r.left < -1); }).map(e => e.outerHTML.slice(0, 80))"""
    )
    assert offscreen == []
    name = {"/": "threads-phone.png", "/environments": "environments-phone.png"}.get(path, "thread-phone.png")
    screenshot(phone, name)
    phone.context.close()
    assert errors == []
