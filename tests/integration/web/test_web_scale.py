"""The web page at real scale (issue 14), in Debian's headless Chromium against the two
linked servers of ``conftest.py``: a persistent monitor that printed 300 lines (one thread),
and a fleet of dozens of threads across both environments — children that answer, fail
with a reason, or answer late as a follow-up.

Waits are on DOM states and on the servers' own ``/wait`` endpoints and event feeds.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from webkit import await_view, expect, open_page, screenshot, unique_ids

from kit import new_thread, thread, wait_settled
from tether.launch import Server

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

LINES = 300
#: The bound the issue sets: a thread page after 300 monitor events.
PAGE_BYTES = 150_000
RENDER_MS = 1000


def _monitor_script() -> dict[str, Any]:
    """A persistent monitor printing ``LINES`` lines, each drawing a progress run."""
    command = f'for i in $(seq {LINES}); do echo "line $i of the build log"; sleep 0.06; done; sleep 1'
    return {
        "tether_script": 1,
        "rules": [
            {
                "on": "start",
                "do": [{"monitor": command, "persistent": True, "id": "m"}, {"reply": "WATCHING"}],
            },
            {"on": "monitor_event", "repeat": True, "do": [{"reply": "still building"}]},
            {"on": "monitor_finished", "do": [{"reply": "BUILD DONE"}]},
        ],
    }


def _answer(text: str) -> dict[str, Any]:
    return {"tether_script": 1, "rules": [{"on": "start", "do": [{"reply": text}]}]}


def _failing(reason: str) -> dict[str, Any]:
    return {"tether_script": 1, "rules": [{"on": "start", "do": [{"fail": reason}]}]}


def _late(seconds: float) -> dict[str, Any]:
    """Probe 1's child: WAITING now, FINAL (as a follow-up) once its command ended."""
    return {
        "tether_script": 1,
        "rules": [
            {
                "on": "start",
                "do": [{"bash": f"sleep {seconds}; echo OK", "background": True}, {"reply": "WAITING"}],
            },
            {"on": "background_command", "do": [{"reply": "FINAL: all 212 tests passed"}]},
        ],
    }


def _fleet_script(per_environment: int) -> dict[str, Any]:
    """A parent delegating ``per_environment`` tasks here and as many to beta: answers, one
    failure with a reason, and one late answer each."""
    delegates = []
    for where in ("alpha", "beta"):
        for n in range(per_environment):
            if n == 0:
                task, title = _failing("ruff found 3 errors"), f"lint on {where}"
            elif n == 1:
                task, title = _late(1.0), f"test suite on {where}"
            else:
                task, title = _answer(f"part {n} done"), f"part {n} on {where}"
            delegates.append({"delegate": {"task": task, "title": title, "environment": where}})
    return {
        "tether_script": 1,
        "rules": [
            {"on": "start", "do": [*delegates, {"reply": "delegated"}]},
            {"on": "delegated_task", "repeat": True, "do": [{"reply": "noted"}]},
        ],
    }


@pytest.fixture(scope="module")
def scale(pair: dict[str, Server]) -> Iterator[dict[str, str]]:
    alpha = pair["alpha"]
    monitor = new_thread(alpha, _monitor_script(), "nightly build (monitor)")
    fleet = new_thread(alpha, _fleet_script(12), "release fleet")
    solo = [new_thread(alpha, _answer(f"note {n}"), f"scratch note {n}") for n in range(4)]
    later = {
        "tether_script": 1,
        "rules": [{"on": "start", "do": [{"schedule": {"in_ms": 600_000, "text": "look again"}}]}],
    }
    scheduled = new_thread(alpha, later, "check back later")
    for thread_id in (monitor, fleet, *solo):
        wait_settled(alpha, thread_id, timeout=120)
    # a persistent monitor is not held: its thread settles while it still prints
    await_view(alpha, monitor, _monitor_ended, "the monitor's end", timeout=120)
    yield {"monitor": monitor, "fleet": fleet, "scheduled": scheduled}


def _monitor_ended(view: dict[str, Any]) -> bool:
    return view["attention"] == "settled" and all(i["status"] != "running" for i in view["background"])


def _monitor_lines(view: dict[str, Any]) -> int:
    return sum(
        len((m["text"] or "").splitlines())
        for m in view["messages"]
        if (m.get("source") or {}).get("kind") == "monitor_event"
    )


def test_a_busy_monitor_is_one_small_group(page: Any, pair: dict[str, Server], scale: dict[str, str]) -> None:
    alpha, thread_id = pair["alpha"], scale["monitor"]
    view = thread(alpha, thread_id)
    progress = [r for r in view["runs"] if r["trigger"]["kind"] == "monitor_event"]
    lines = _monitor_lines(view)
    assert lines == LINES, lines
    assert len(progress) >= 150, len(progress)  # most lines drew their own progress run
    body = httpx.get(f"{alpha.url}/threads/{thread_id}", cookies={"tether_token": alpha.token}, timeout=10)
    assert body.status_code == 200
    assert len(body.content) < PAGE_BYTES, len(body.content)

    page.goto(f"{alpha.url}/threads/{thread_id}")
    rendered = page.evaluate(
        "() => { const n = performance.getEntriesByType('navigation')[0];"
        " return n.domContentLoadedEventEnd - n.startTime; }"
    )
    print(f"\n{len(progress)} progress runs, {lines} lines: {len(body.content)} bytes, {rendered:.0f} ms")
    assert rendered < RENDER_MS, rendered
    group = page.locator("li.monitor-group")
    expect()(group).to_have_count(1)
    expect()(group).to_contain_text(f"printed {lines} lines")
    fold = group.locator("details.fold")
    expect()(fold.locator("ol.log > li")).to_have_count(20)  # the rest is on demand
    assert page.locator("#timeline-" + thread_id + " > li").count() <= 5  # start, group, finished
    # the newest activity at once: the monitor's end, after the group
    page.get_by_role("link", name="Jump to latest ↓").click()
    expect()(page.locator("#timeline-end")).to_be_in_viewport()
    expect()(page.locator(f"#timeline-{thread_id} > li").last).to_contain_text("BUILD DONE")
    screenshot(page, "thread-monitor.png")
    fold.locator("summary").click()
    fold.get_by_role("link", name=re.compile(r"^All \d+ lines and replies")).click()
    log = page.locator("ol.log.full")
    expect()(log.locator("li.line")).to_have_count(lines)
    expect()(log).to_contain_text("line 1 of the build log")
    assert unique_ids(page) == []


def test_task_cards_say_how_each_answer_came(
    page: Any, pair: dict[str, Server], scale: dict[str, str]
) -> None:
    alpha, fleet = pair["alpha"], scale["fleet"]
    page.goto(f"{alpha.url}/threads/{fleet}")
    cards = page.locator("li.task-card")
    expect()(cards).to_have_count(24)
    # failed, with the reason, wherever the child ran
    for where in ("alpha", "beta"):
        failed = cards.filter(has_text=f"lint on {where}")
        expect()(failed).to_have_class(re.compile(r"\bst-failed\b"))
        expect()(failed.locator(".msg.error")).to_contain_text("ruff found 3 errors")
    # the interim WAITING as the result, then the follow-up that carried FINAL
    late = cards.filter(has_text="test suite on beta")
    answers = late.locator("ol.answers > li")
    expect()(answers).to_have_count(2)
    expect()(answers.nth(0)).to_contain_text("result")
    expect()(answers.nth(0)).to_contain_text("WAITING")
    expect()(answers.nth(1)).to_contain_text("follow-up")
    expect()(answers.nth(1)).to_contain_text("FINAL: all 212 tests passed")
    expect()(answers.nth(1)).to_contain_text("the final answer")
    # finished tasks left the running list; their rows show how long they really took
    expect()(page.locator(f"#background-{fleet} > li")).to_have_count(0)
    ended = page.locator(f"#background-ended-{fleet} > li")
    expect()(ended).to_have_count(24 + 2)  # and the two follow-ups
    suite = ended.filter(has_text="test suite on alpha").first
    expect()(suite).to_contain_text("FINAL: all 212 tests passed")
    expect()(suite).not_to_contain_text("ran 0 s")  # the child's command slept 1 s
    screenshot(page, "thread-tasks.png")


def test_a_schedule_counts_down(page: Any, pair: dict[str, Server], scale: dict[str, str]) -> None:
    alpha, thread_id = pair["alpha"], scale["scheduled"]
    page.goto(f"{alpha.url}/threads/{thread_id}")
    row = page.locator(f"#background-{thread_id} > li")
    expect()(row).to_have_count(1)
    expect()(row).to_contain_text("scheduled")
    expect()(row.locator("time.countdown")).to_have_text(re.compile(r"^(9|10) min \d+ s$"))
    expect()(row).not_to_contain_text("running")


def test_the_threads_list_nests_children(page: Any, pair: dict[str, Server], scale: dict[str, str]) -> None:
    alpha, fleet = pair["alpha"], scale["fleet"]
    page.goto(alpha.url + "/")
    settled = page.locator("#groupbox-settled")
    expect()(settled).not_to_have_attribute("open", "")  # settled threads are folded away
    kids = page.locator(f"#kids-{fleet} > li")
    expect()(kids).to_have_count(24)  # here and on beta, under the task that made them
    expect()(page.locator(f"#kids-{fleet} > li.row[id^='rthread-']")).to_have_count(12)
    expect()(kids.first).to_contain_text("task of “release fleet”")
    # a linked child's failure says why (its environment's own reading)
    lint = kids.filter(has_text="lint on beta")
    expect()(lint).to_contain_text("failed: ruff found 3 errors")
    # search finds it, with the thread it sits in; the rest hides
    page.get_by_label("Search threads").fill("lint on beta")
    expect()(settled).to_have_attribute("open", "")
    expect()(page.locator("#groups li.row:visible")).to_have_count(2)
    expect()(page.locator(f"#thread-{fleet}")).to_be_visible()
    expect()(lint).to_be_visible()
    page.get_by_label("Search threads").fill("fleet")
    expect()(page.locator(f"#thread-{fleet}")).to_be_visible()
    screenshot(page, "threads.png")
    page.get_by_label("Search threads").fill("")
    expect()(kids).to_have_count(24)


def test_a_new_child_appears_under_its_parent_live(page: Any, pair: dict[str, Server]) -> None:
    alpha = pair["alpha"]
    page.goto(alpha.url + "/")
    expect()(page.locator("#live-status")).to_have_attribute("data-state", "live")
    parent = new_thread(alpha, _fleet_script(1), "live fleet")
    kids = page.locator(f"#kids-{parent} > li")
    expect()(kids).to_have_count(2)
    expect()(kids.filter(has_text="lint on beta")).to_contain_text("failed: ruff found 3 errors")
    expect()(page.locator(f"#thread-{parent}")).to_contain_text("Settled")
    expect()(kids).to_have_count(2)  # the parent's re-renders kept its children
    assert unique_ids(page) == []


def test_stop_a_linked_thread_s_monitor(page: Any, pair: dict[str, Server]) -> None:
    alpha = pair["alpha"]
    child = {
        "tether_script": 1,
        "rules": [
            {"on": "start", "do": [{"monitor": "sleep 120", "id": "m"}, {"reply": "WATCHING"}]},
            {"on": "monitor_finished", "do": [{"reply": "the watch ended"}]},
        ],
    }
    delegate = {"task": child, "title": "watch on beta", "environment": "beta"}
    script = {
        "tether_script": 1,
        "rules": [{"on": "start", "do": [{"delegate": delegate}, {"reply": "sent"}]}],
    }
    parent = new_thread(alpha, script, "remote watcher")
    page.goto(f"{alpha.url}/threads/{parent}")
    card = page.locator("li.task-card")
    expect()(card).to_contain_text("WATCHING")
    card.get_by_role("link", name="child thread").click()
    row = page.locator("ul.bg > li.item").filter(has_text="sleep 120")
    row.get_by_role("button", name=re.compile("^Stop monitor")).click()
    notice = page.locator("li.item + li.notice-slot")
    expect()(notice).to_contain_text("Stopped monitor “sleep 120”")
    expect()(notice).to_contain_text("in beta")
    expect()(page.locator("ol.timeline")).to_contain_text("the watch ended")


def test_an_unreachable_peer_keeps_its_threads_stale(
    browser: Any, pair: dict[str, Server], scale: dict[str, str]
) -> None:
    """Last: it stops beta (and starts it again)."""
    alpha, beta, fleet = pair["alpha"], pair["beta"], scale["fleet"]
    links, errors = open_page(browser, alpha)
    links.goto(alpha.url + "/environments")
    row = links.locator("#links > tr")
    expect()(row.locator(".badge")).to_have_text("ok")
    beta.stop()
    try:
        expect()(row.locator(".badge")).not_to_have_text("ok")  # live, from the link's own state
        page, more = open_page(browser, alpha)
        expect()(page.locator("p.warn")).to_contain_text("beta")
        expect()(page.locator("p.warn")).to_contain_text("shown as last seen")
        stale = page.locator(f"#kids-{fleet} > li.stale")
        expect()(stale).to_have_count(12)  # beta's children of the fleet did not vanish
        expect()(stale.first.locator(".badge.stale")).to_contain_text("stale")
        screenshot(page, "threads-stale.png")
        page.context.close()
    finally:
        beta.start(90.0)
    expect()(row.locator(".badge")).to_have_text("ok")
    links.context.close()
    assert errors == [] and more == []
