"""The ``claude`` provider against a FAKE Claude Code CLI, driven by the real Claude Agent SDK.

The real CLI (the SDK's bundled one) is tested in ``test_claude_cli.py``: the probes local
and remote, Monitor progress, stops of the child's environment, foreground commands,
subagents, tether's MCP tools, secrets, start failures. The fake stays only for what the
real executable cannot be made to show on demand against a scripted model:

- a background end reported only as ``task_updated`` (or notification and update in either
  order), and a command failing with a given exit code through those frames;
- the interleavings of a CLI wake with queued prompts (a wake arriving while a user
  message is queued; a user message queued behind a running wake), held by files;
- the CLI dying mid-session, a resumed session the CLI no longer has, a failed turn;
- how the SDK is driven (argv, environment) — the fake logs each start.

A real ``tether serve`` whose ``[providers.claude] cli_path`` is ``fakes/claude``: the SDK
starts it exactly as it starts Claude Code and talks stream-json to it. Each thread's
first message scripts the fake (``{"fake_claude": {"steps": [...]}}``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kit import shutdown
from tether.launch import Server

from .helpers import (
    await_state,
    providers,
    thread,
    wait_settled,
)
from .models.claudekit import CliServer

FAKES = Path(__file__).parent / "fakes"
CLAUDE = FAKES / "claude"


#: We run as root: the provider (like the real CLI) refuses bypassPermissions without it.
SANDBOX = {"IS_SANDBOX": "1"}


def write_config(data: Path, extra: str = "") -> None:
    data.mkdir(parents=True, exist_ok=True)
    (data / "config.toml").write_text(f'[providers.claude]\ncli_path = "{CLAUDE}"\n{extra}')


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = tmp_path_factory.mktemp("claude") / "main"
    write_config(data)
    server = CliServer(data, "main", env=SANDBOX).start()
    yield server
    shutdown([server], graceful=True)


@pytest.fixture
def client(env: Server) -> Iterator[httpx.Client]:
    with env.client() as found:
        yield found


def fake(*steps: dict[str, Any]) -> str:
    return json.dumps({"fake_claude": {"steps": list(steps)}})


def start(client: httpx.Client, message: str) -> str:
    created = client.post("/api/threads", json={"provider": "claude", "message": message})
    assert created.status_code == 201, created.text
    return created.json()["threadId"]


def send(client: httpx.Client, thread_id: str, message: str) -> dict[str, Any]:
    sent = client.post(f"/api/threads/{thread_id}/messages", json={"text": message})
    assert sent.status_code == 200, sent.text
    return sent.json()


def runs_ended(client: httpx.Client, thread_id: str, count: int) -> Callable[[], dict[str, Any] | None]:
    """A check: the thread has at least ``count`` runs, all of them over."""

    def check() -> dict[str, Any] | None:
        view = thread(client, thread_id)
        runs = view["runs"]
        if len(runs) >= count and all(r["status"] not in ("queued", "running") for r in runs):
            return view
        return None

    return check


def summary(view: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    return [(r["trigger"]["kind"], r["status"], r["reply"]) for r in view["runs"]]


def assistant_texts(view: dict[str, Any]) -> list[str]:
    return [m["text"] for m in view["messages"] if m["role"] == "assistant"]


def invocations(server: Server) -> list[dict[str, Any]]:
    path = server.data / "workspace" / ".fake-claude" / "invocations.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---------------------------------------------------------------------------- background ends


@pytest.mark.parametrize("end", ["notification", "updated", "both"])
def test_a_background_end_wakes_once_however_it_is_reported(
    env: Server, client: httpx.Client, end: str
) -> None:
    """The end of a background task comes as a task_notification, or only as a
    task_updated reaching a final status, or as both: one wake run either way, and that run
    takes the turn the CLI started itself."""
    thread_id = start(
        client,
        fake(
            {"background": "sleep 0.2; echo OK", "end": end, "wake": [{"say": f"DONE {end}"}]},
            {"say": "STARTED"},
        ),
    )
    await_state(env, runs_ended(client, thread_id, 2), what="the wake run")
    wait_settled(client, thread_id)
    view = thread(client, thread_id)
    assert summary(view) == [
        ("user", "completed", "STARTED"),
        ("background_command", "completed", f"DONE {end}"),
    ]
    [item] = view["background"]
    assert item["status"] == "ended"
    assert item["exitCode"] == (None if end == "updated" else 0)  # a task_updated carries no exit code
    assert assistant_texts(view) == ["STARTED", f"DONE {end}"]
    notices = [m for m in view["messages"] if m["role"] == "notification"]
    assert len(notices) == 1 and notices[0]["source"]["kind"] == "background_command"


def test_a_failed_background_command_wakes_with_its_exit_code(env: Server, client: httpx.Client) -> None:
    thread_id = start(
        client, fake({"background": "exit 3", "wake": [{"say": "SAW IT FAIL"}]}, {"say": "STARTED"})
    )
    await_state(env, runs_ended(client, thread_id, 2), what="the wake run")
    view = thread(client, thread_id)
    assert summary(view)[-1] == ("background_command", "completed", "SAW IT FAIL")
    [item] = view["background"]
    assert (item["status"], item["exitCode"]) == ("failed", 3)


def test_a_wake_arriving_while_a_user_message_is_queued(
    env: Server, client: httpx.Client, tmp_path: Path
) -> None:
    """Runs: 1 starts a build in the background; 2 (a user message) is running when the
    build ends; 3 (another user message) was queued before that, so the wake run queues
    behind it. Claude Code starts its own wake turn as soon as turn 2 is over, before it
    reads prompt 3: run 3 must skip that turn and take its own, and the wake run then takes
    the CLI's turn."""
    built, held = tmp_path / "built", tmp_path / "held"
    thread_id = start(
        client,
        fake(
            {
                "background": f"while [ ! -e {built} ]; do sleep 0.02; done; echo built",
                "wake": [{"say": "BUILD DONE"}],
            },
            {"say": "BUILDING"},
        ),
    )
    await_state(env, runs_ended(client, thread_id, 1), what="run 1")
    assert send(client, thread_id, fake({"wait_file": str(held)}, {"say": "HELD"}))["delivery"] == "started"
    assert send(client, thread_id, fake({"say": "STATUS OK"}))["delivery"] == "queued"
    built.touch()

    def wake_queued() -> bool:
        return any(r["trigger"]["kind"] == "background_command" for r in thread(client, thread_id)["runs"])

    await_state(env, wake_queued, what="the wake run to be queued")
    assert [r["status"] for r in thread(client, thread_id)["runs"]] == [
        "completed",
        "running",
        "queued",
        "queued",
    ]
    held.touch()
    await_state(env, runs_ended(client, thread_id, 4), what="all four runs")
    view = thread(client, thread_id)
    assert summary(view) == [
        ("user", "completed", "BUILDING"),
        ("user", "completed", "HELD"),
        ("user", "completed", "STATUS OK"),
        ("background_command", "completed", "BUILD DONE"),
    ]
    by_run = {r["runId"]: r["trigger"]["kind"] for r in view["runs"]}
    said = [(by_run[m["runId"]], m["text"]) for m in view["messages"] if m["role"] == "assistant"]
    assert said == [
        ("user", "BUILDING"),
        ("user", "HELD"),
        ("user", "STATUS OK"),
        ("background_command", "BUILD DONE"),
    ]


def test_a_user_message_queues_behind_a_pending_wake(
    env: Server, client: httpx.Client, tmp_path: Path
) -> None:
    """The wake run is running (the CLI's own turn is still at work) when a person writes:
    the message waits for the wake run, and is sent to Claude Code only after it."""
    gate = tmp_path / "gate"
    thread_id = start(
        client,
        fake(
            {"background": "sleep 0.1", "wake": [{"wait_file": str(gate)}, {"say": "WOKEN"}]},
            {"say": "STARTED"},
        ),
    )

    def wake_running() -> bool:
        return any(
            r["trigger"]["kind"] == "background_command" and r["status"] == "running"
            for r in thread(client, thread_id)["runs"]
        )

    await_state(env, wake_running, what="the wake run")
    assert send(client, thread_id, fake({"say": "AFTER"}))["delivery"] == "queued"
    gate.touch()
    await_state(env, runs_ended(client, thread_id, 3), what="the queued message's run")
    view = thread(client, thread_id)
    assert summary(view) == [
        ("user", "completed", "STARTED"),
        ("background_command", "completed", "WOKEN"),
        ("user", "completed", "AFTER"),
    ]
    assert assistant_texts(view) == ["STARTED", "WOKEN", "AFTER"]


# ---------------------------------------------------------------------------- session and tools


def test_the_session_gets_tethers_tools_with_a_thread_credential(env: Server, client: httpx.Client) -> None:
    thread_id = start(
        client, fake({"mcp": {"tool": "environment_links", "arguments": {}}, "say_result": True})
    )
    view = await_state(env, runs_ended(client, thread_id, 1), what="the MCP call")
    [run] = view["runs"]
    assert run["status"] == "completed", run
    assert run["reply"].startswith("MCP result:"), run["reply"]
    health = client.get("/api/health").json()
    assert health["environmentId"] in run["reply"]
    started = next(i for i in reversed(invocations(env)) if "argv" in i)
    argv = started["argv"]
    assert argv[argv.index("--permission-mode") + 1] == "bypassPermissions"
    config = Path(argv[argv.index("--mcp-config") + 1])
    assert not any("ttc_" in a for a in argv)  # the credential is not on the command line,
    assert not config.exists()  # and its file is gone once read (the MCP call above used it)
    assert started["emitState"] == "1" and started["entrypoint"] == "sdk-py"


def test_one_session_per_thread_across_turns(env: Server, client: httpx.Client) -> None:
    """Turns after the first go to the same live CLI process: it is not closed at a result."""
    thread_id = start(client, fake({"say": "SESSION ONE"}))
    await_state(env, runs_ended(client, thread_id, 1), what="run 1")
    send(client, thread_id, fake({"say": "SESSION TWO"}))
    view = await_state(env, runs_ended(client, thread_id, 2), what="run 2")
    assert [r["reply"] for r in view["runs"]] == ["SESSION ONE", "SESSION TWO"]
    pids = {
        i["pid"]
        for i in invocations(env)
        if "SESSION ONE" in i.get("prompt", "") or "SESSION TWO" in i.get("prompt", "")
    }
    assert len(pids) == 1


def test_a_failed_turn_fails_the_run(env: Server, client: httpx.Client) -> None:
    thread_id = start(client, fake({"say": "trying"}, {"fail": "the model broke"}))
    view = await_state(env, runs_ended(client, thread_id, 1), what="the failed run")
    [run] = view["runs"]
    assert run["status"] == "failed" and "the model broke" in run["error"], run


def test_a_restart_resumes_the_session(tmp_path: Path) -> None:
    """After tether restarts, the thread's next turn resumes its Claude Code session by the
    id kept in the thread's state; a session the CLI no longer has is started afresh."""
    data = tmp_path / "main"
    write_config(data)
    sessions = data / "workspace" / ".fake-claude" / "sessions"
    server = CliServer(data, "main", env=SANDBOX).start()
    try:
        with server.client() as client:
            thread_id = start(client, "hello")
            await_state(server, runs_ended(client, thread_id, 1), what="run 1")
        server.kill()
        server.start()
        with server.client() as client:
            send(client, thread_id, "hello again")
            await_state(server, runs_ended(client, thread_id, 2), what="run 2")
        [session] = [p.stem for p in sessions.iterdir()]
        starts = [i["argv"] for i in invocations(server) if "argv" in i]
        assert len(starts) == 2
        assert not any(a.startswith("--resume") for a in starts[0]) and f"--resume={session}" in starts[1]

        server.kill()
        for found in sessions.iterdir():
            found.unlink()  # the CLI lost it
        server.start()
        with server.client() as client:
            send(client, thread_id, "and again")
            view = await_state(server, runs_ended(client, thread_id, 3), what="run 3")
        assert [r["reply"] for r in view["runs"]] == ["ack: hello", "ack: hello again", "ack: and again"]
        starts = [i["argv"] for i in invocations(server) if "argv" in i]
        assert f"--resume={session}" in starts[2] and not any(a.startswith("--resume") for a in starts[3])
    finally:
        shutdown([server], graceful=True)


def test_a_lost_session_ends_its_background_work(env: Server, client: httpx.Client) -> None:
    """Claude Code dies with a background command running: the run fails, the command's
    item ends as lost, and its wake run goes to a new (resumed) session as a prompt."""
    thread_id = start(client, fake({"background": "sleep 3", "wake": [{"say": "never"}]}, {"say": "STARTED"}))
    await_state(env, runs_ended(client, thread_id, 1), what="run 1")
    send(client, thread_id, fake({"bash": "kill -9 $PPID"}))
    view = await_state(env, runs_ended(client, thread_id, 3), what="the wake after the crash")
    runs = summary(view)
    assert runs[0] == ("user", "completed", "STARTED")
    assert runs[1][:2] == ("user", "failed")
    assert runs[2][0] == "background_command" and runs[2][1] == "completed"
    assert runs[2][2].startswith("ack: [tether: background command]"), runs[2]
    [item] = view["background"]
    assert item["status"] == "failed"


# ---------------------------------------------------------------------------- tether providers


def test_providers_command_says_whether_claude_and_codex_are_usable(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(
        f'[providers.claude]\ncli_path = "{CLAUDE}"\n\n'
        f'[providers.codex]\nexecutable = "{FAKES / "codex"}"\napi_key_env = "TETHER_TEST_CODEX_KEY"\n'
    )
    rows = providers(tmp_path, {"TETHER_TEST_CODEX_KEY": "", "IS_SANDBOX": "1"})
    assert rows["claude"] == {"provider": "claude", "usable": True, "reason": None}
    assert rows["codex"]["usable"] is False
    assert "TETHER_TEST_CODEX_KEY" in rows["codex"]["reason"]
    assert (
        providers(tmp_path, {"TETHER_TEST_CODEX_KEY": "sk-test", "IS_SANDBOX": "1"})["codex"]["usable"]
        is True
    )

    (tmp_path / "config.toml").write_text(
        f'[providers.claude]\ncli_path = "{tmp_path / "no-such-claude"}"\n\n'
        '[providers.codex]\nexecutable = "no-such-codex-here"\n'
    )
    rows = providers(tmp_path)
    assert rows["claude"]["usable"] is False and "not found" in rows["claude"]["reason"]
    assert rows["codex"]["usable"] is False and "not found" in rows["codex"]["reason"]
