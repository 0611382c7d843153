"""The ``codex`` provider against a fake ``codex exec --json`` (``fakes/codex``).

A real ``tether serve`` whose ``[providers.codex] executable`` is the fake, with the API
key in the server's environment. Each turn is one ``codex exec`` process; later turns
``resume`` the session. Codex has no wake of its own: background work goes through
tether's MCP server, which the fake really calls with the credential it was given.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tether.launch import Server

from .conftest import _shutdown
from .helpers import await_state, probe_1_with, thread

FAKES = Path(__file__).parent / "fakes"
KEY_ENV = "FAKE_CODEX_KEY"
KEY = "sk-codex-fake-42"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = tmp_path_factory.mktemp("codex") / "main"
    data.mkdir(parents=True)
    (data / "config.toml").write_text(
        f'[providers.codex]\nexecutable = "{FAKES / "codex"}"\n'
        f'model = "gpt-fake"\napi_key_env = "{KEY_ENV}"\n'
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(KEY_ENV, KEY)  # tether.launch.Server passes its environment on
        server = Server(data, "main").start()
    yield server
    _shutdown([server])


@pytest.fixture
def client(env: Server) -> Iterator[httpx.Client]:
    with env.client() as found:
        yield found


def fake(*turns: list[dict[str, Any]]) -> str:
    return json.dumps({"fake_codex": {"turns": list(turns)}})


def start(client: httpx.Client, message: str) -> str:
    created = client.post("/api/threads", json={"provider": "codex", "message": message})
    assert created.status_code == 201, created.text
    return created.json()["threadId"]


def runs_ended(client: httpx.Client, thread_id: str, count: int) -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        view = thread(client, thread_id)
        runs = view["runs"]
        if len(runs) >= count and all(r["status"] not in ("queued", "running") for r in runs):
            return view
        return None

    return check


def invocations(server: Server) -> list[dict[str, Any]]:
    path = server.data / "workspace" / ".fake-codex" / "invocations.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_probe_1_with_a_codex_child(env: Server, client: httpx.Client) -> None:
    """The codex child starts background work through tether's MCP server (a monitor that
    does not hold it), replies WAITING, is woken by tether when the work ends, and replies
    FINAL in a resumed session: FINAL reaches the parent exactly once."""
    record = probe_1_with(env, client, "codex")
    row = record["row"]
    assert row["delivered"] and row["finalCount"] == 1, row
    assert row["deliveredAs"] == "follow-up", row
    child = record["child"]
    assert [(r["trigger"]["kind"], r["reply"]) for r in child["runs"]] == [
        ("task", "WAITING"),
        ("monitor_finished", "FINAL"),
    ]
    [item] = child["background"]
    assert (item["kind"], item["status"], item["exitCode"]) == ("monitor", "ended", 0)
    assert [m["text"] for m in child["messages"] if m["role"] == "assistant"] == ["WAITING", "FINAL"]

    runs = [i for i in invocations(env) if i["prompt"] == "run the suite" or i["resume"]]
    first = next(i for i in runs if i["prompt"] == "run the suite")
    assert first["resume"] is None and first["hasKey"] and first["tokenEnv"] == "TETHER_MCP_TOKEN"
    argv = first["argv"]
    assert argv[:4] == ["exec", "--json", "--skip-git-repo-check", "--sandbox"]
    assert argv[argv.index("--model") + 1] == "gpt-fake"
    assert f'mcp_servers.tether.url="{env.url}/mcp"' in argv
    assert argv[-1] == "-"  # the prompt goes on stdin


def test_later_turns_resume_the_session_with_every_flag(env: Server, client: httpx.Client) -> None:
    thread_id = start(client, fake([{"say": "FIRST"}], [{"say": "SECOND"}]))
    await_state(env, runs_ended(client, thread_id, 1), what="run 1")
    sent = client.post(f"/api/threads/{thread_id}/messages", json={"text": "and now?"})
    assert sent.status_code == 200, sent.text
    view = await_state(env, runs_ended(client, thread_id, 2), what="run 2")
    assert [r["reply"] for r in view["runs"]] == ["FIRST", "SECOND"]
    first, second = [i for i in invocations(env) if '"FIRST"' in i["prompt"] or i["prompt"] == "and now?"]
    assert first["resume"] is None and second["resume"]
    assert second["argv"][-3:] == ["resume", second["resume"], "-"]
    assert second["argv"][:-3] == first["argv"][:-1]  # every flag again
    sessions = [p.stem for p in (env.data / "workspace" / ".fake-codex" / "sessions").iterdir()]
    assert second["resume"] in sessions


def test_agent_messages_are_said_and_tools_are_not(env: Server, client: httpx.Client) -> None:
    thread_id = start(
        client,
        fake(
            [
                {"reasoning": "let me look"},
                {"say": "Looking at the tree."},
                {"command": "echo hello; exit 2"},
                {"say": "Done looking."},
            ]
        ),
    )
    view = await_state(env, runs_ended(client, thread_id, 1), what="run 1")
    [run] = view["runs"]
    assert (run["status"], run["reply"]) == ("completed", "Done looking.")
    assert [m["text"] for m in view["messages"] if m["role"] == "assistant"] == [
        "Looking at the tree.",
        "Done looking.",
    ]


@pytest.mark.parametrize(
    ("steps", "status", "error"),
    [
        ([{"say": "trying"}, {"fail": "model overloaded"}], "failed", "Codex: model overloaded"),
        ([{"error": "stream disconnected"}], "failed", "Codex: stream disconnected"),
        ([{"transient_error": "Reconnecting... 1/5"}, {"say": "RECOVERED"}], "completed", None),
    ],
)
def test_failures_fail_the_run_with_codexs_message(
    env: Server, client: httpx.Client, steps: list[dict[str, Any]], status: str, error: str | None
) -> None:
    thread_id = start(client, fake(steps))
    view = await_state(env, runs_ended(client, thread_id, 1), what="run 1")
    [run] = view["runs"]
    assert run["status"] == status, run
    assert run["error"] == error
    if status == "completed":
        assert run["reply"] == "RECOVERED"


def test_an_unusable_codex_is_refused_with_a_reason(server: Server) -> None:
    """The default environment has no codex executable: creating a codex thread says why."""
    with server.client() as client:
        created = client.post("/api/threads", json={"provider": "codex", "message": "hi"})
    assert created.status_code in (400, 422), created.text
    assert "not found" in created.json()["error"]["message"]
