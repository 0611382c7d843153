"""The REAL ``codex`` CLI (npm's ``@openai/codex``, pinned in tests/agents/package.json)
through tether, against a scripted Responses API server (``models/responses_server.py``).

Two real ``tether serve`` processes, ``main`` linked to ``peer``, both running real ``codex
exec`` / ``codex exec resume`` as their ``codex`` provider, pointed at the scripted model by
a custom model provider (``extra_args``). Only the model service is scripted: Codex's own
agent loop, its shell, its deferred MCP tools (found through ``tool_search``) and its MCP
client of tether's ``/mcp`` are the real ones. The child's task text carries its plan (see
the server's docstring); a script parent delegates it and records every wake.

``.ci/run`` installs the CLI (``npm ci --prefix tests/agents``); elsewhere, without it,
these tests skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from kit import await_exit, is_alive, link, shutdown, tasks_of, thread, wait_settled, wrapper_pid
from tether.launch import Server, free_port
from tether.probes import outcome
from tether.providers.codex import DEFAULT_MODEL, CodexError, CodexEvents, CodexProvider

from .links.linkkit import assert_delivered_once, await_finished, await_on
from .models.responses_server import PLAN, ResponsesServer

CODEX = Path(__file__).parents[1] / "agents" / "node_modules" / ".bin" / "codex"
KEY_ENV = "TETHER_TEST_CODEX_KEY"
KEY = "sk-scripted-codex-7f3a"

pytestmark = pytest.mark.skipif(  # never in CI, which installs it: there a missing CLI fails
    not CODEX.exists() and not os.environ.get("CI"),
    reason="the real codex is not installed: run `npm ci --prefix tests/agents`",
)


def provider_config(model: ResponsesServer) -> str:
    """``[providers.codex]`` of an environment whose Codex talks to the scripted model."""
    scripted = {"name": "scripted", "base_url": model.base_url, "wire_api": "responses",
                "env_key": "CODEX_API_KEY"}
    args = ["-c", 'model_provider="scripted"']
    for key, value in scripted.items():
        args += ["-c", f"model_providers.scripted.{key}={json.dumps(value)}"]
    return (f"[providers.codex]\nexecutable = {json.dumps(str(CODEX))}\n"
            f"api_key_env = {json.dumps(KEY_ENV)}\nextra_args = {json.dumps(args)}\n")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ResponsesServer]:
    server = ResponsesServer(tmp_path_factory.mktemp("model") / "requests.jsonl", api_key=KEY).start()
    yield server
    server.stop()


@contextlib.contextmanager
def codex_home() -> Iterator[Path]:
    """A fresh ``CODEX_HOME``, outside /tmp: Codex refuses to put its helper executables
    (``codex-linux-sandbox``, run by its sandbox) under a temporary directory, and then
    every shell command of the model fails where bubblewrap is installed. The clone itself
    may lie under /tmp (a CI checkout), so the home goes under the user's cache instead."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    cache.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="tether-codex-home-", dir=cache))
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def envs(tmp_path_factory: pytest.TempPathFactory, model: ResponsesServer) -> Iterator[dict[str, Server]]:
    """``main`` and ``peer`` (linked main → peer), both with the real Codex."""
    root = tmp_path_factory.mktemp("codex-real")
    made = {name: Server(root / name, name) for name in ("main", "peer")}
    for server in made.values():
        server.data.mkdir(parents=True)
        (server.data / "config.toml").write_text(provider_config(model))
    with pytest.MonkeyPatch.context() as patch, codex_home() as home:
        patch.setenv(KEY_ENV, KEY)  # tether.launch.Server passes its environment on
        patch.setenv("CODEX_HOME", str(home))
        try:
            with ThreadPoolExecutor(2) as pool:  # a loaded 2-core machine: allow a slow start
                list(pool.map(lambda server: server.start(timeout=90), made.values()))
            link(made["main"], made["peer"])
            yield made
        finally:  # also when a start failed: the other server runs
            shutdown(list(made.values()), graceful=True)


@pytest.fixture
def up(envs: dict[str, Server]) -> dict[str, Server]:
    """Both servers running (a failed test may have left one down)."""
    for server in envs.values():
        if server.process is None or server.process.poll() is not None:
            server.start(timeout=90)
    return envs


def plan(title: str, **rules: list[dict[str, Any]]) -> str:
    """A task text carrying the scripted model's plan (rule names may hold spaces: ``_``)."""
    return f"{title}\n{PLAN}{json.dumps({name.replace('_', ' '): steps for name, steps in rules.items()})}"


def say(text: str) -> dict[str, Any]:
    return {"say": text}


def tool(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool": name, "arguments": arguments}


def delegate_codex(server: Server, task: str, environment: str | None = None) -> str:
    """A script parent that delegates ``task`` to a codex child (async) and notes its wakes."""
    spec: dict[str, Any] = {"task": task, "id": "c", "title": "codex child", "provider": "codex"}
    if environment:
        spec["environment"] = environment
    script = {"tether_script": 1, "rules": [
        {"on": "start", "do": [{"delegate": spec}, {"reply": "delegated"}]},
        {"on": "delegated_task", "repeat": True, "do": [{"reply": "got {{text}}"}]},
    ]}
    with server.client() as client:
        created = client.post("/api/threads", json={"provider": "script", "message": json.dumps(script)})
    assert created.status_code == 201, created.text
    return str(created.json()["threadId"])


def child_of(origin: Server, parent_id: str, where: Server) -> dict[str, Any]:
    return thread(where, tasks_of(origin, parent_id)[0]["childThreadId"])


def replies(view: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [(r["trigger"]["kind"], r["reply"]) for r in view["runs"]]


# ------------------------------------------------------------------------------ probes

MONITOR = plan(
    "probe 2: a monitor that holds the task",
    start=[tool("monitor_start", command="for i in 1 2; do echo line$i; sleep 0.2; done"), say("WAITING")],
    monitor_event=[say("PROGRESS")],
    monitor_finished=[say("FINAL")],
)
WAKE = plan(
    "probe 4: a scheduled wake",
    start=[tool("schedule_wake", inMs=300, text="time is up", hold=True), say("WAITING")],
    scheduled=[say("FINAL")],
)
PERSISTENT = plan(
    "probe 6: a persistent monitor",
    start=[tool("monitor_start", command="for i in 1 2 3; do sleep 0.3; echo line$i; done", persistent=True),
           say("WATCHING")],
    monitor_event=[say("PROGRESS")],
    monitor_finished=[say("FINAL")],
)
GRANDCHILD = json.dumps({"tether_script": 1, "rules": [
    {"on": "start", "do": [{"reply": "READY"}]},
    {"on": "message", "do": [{"reply": "GRANDCHILD DONE"}]},
]})
DELEGATE = plan(
    "a child that delegates, then sends its own child a message",
    start=[tool("delegate_task", task=GRANDCHILD, target={"provider": "script"}, title="grandchild"),
           say("WAITING")],
    **{
        "delegated task:READY": [tool("thread_send", threadId="<<childThreadId>>", message="go on"),
                                 say("SENT")],
        "delegated task:GRANDCHILD DONE": [say("FINAL")],
    },
)
PROBES = {"monitor": MONITOR, "scheduled wake": WAKE, "persistent monitor": PERSISTENT, "delegate": DELEGATE}


#: What the parent gets FINAL as (SPEC §8): a held monitor or wake keeps the task open;
#: the delegating child stays open while its own child is.
DELIVERED_AS = {"monitor": "result", "scheduled wake": "result", "delegate": "result"}


def delivered_as(probe: str, child: dict[str, Any]) -> str:
    """A persistent monitor holds nothing: FINAL is a follow-up when the monitor outlasted
    the first run, else (its end's wake already queued, the child not settled) the result."""
    if probe != "persistent monitor":
        return DELIVERED_AS[probe]
    [monitor] = child["background"]
    return "follow-up" if monitor["endedAt"] > child["runs"][0]["endedAt"] else "result"


def run_probe(envs: dict[str, Server], probe: str, where: str) -> dict[str, Any]:
    """One probe to its end: ``{row, child}`` (``row`` as the demo's table has it)."""
    origin = envs["main"]
    child_env = envs["peer"] if where == "remote" else origin
    parent_id = delegate_codex(origin, PROBES[probe], "peer" if where == "remote" else None)
    tasks, parent = await_finished(origin, parent_id, timeout=90)
    assert_delivered_once(tasks, parent)
    child = child_of(origin, parent_id, child_env)
    wait_settled(child_env, child["threadId"])
    child = child_of(origin, parent_id, child_env)
    return {"row": outcome(1, where, tasks, parent, child["runs"]), "child": child}


@pytest.fixture(scope="module")
def probes(envs: dict[str, Server]) -> dict[tuple[str, str], Any]:
    """Every probe, local and remote, run at once (each mostly waits): its record, or the
    exception that ended it (re-raised by its test)."""
    jobs = [(probe, where) for probe in PROBES for where in ("local", "remote")]
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {job: pool.submit(run_probe, envs, *job) for job in jobs}
    return {job: future.exception() or future.result() for job, future in futures.items()}


@pytest.mark.parametrize("where", ["local", "remote"])
@pytest.mark.parametrize("probe", list(PROBES))
def test_probe_with_the_real_codex(probes: dict[tuple[str, str], Any], probe: str, where: str) -> None:
    """SPEC §8 as it applies to Codex: the child's background work goes through tether's
    MCP tools, called by the real CLI; FINAL reaches the parent exactly once."""
    record = probes[(probe, where)]
    if isinstance(record, BaseException):
        raise record
    row, child = record["row"], record["child"]
    assert row["delivered"] and row["finalCount"] == 1, row
    assert row["deliveredAs"] == delivered_as(probe, child), (row, child["background"], child["runs"])
    assert all(r["status"] == "completed" for r in child["runs"]), child["runs"]
    assert child["runs"][-1]["reply"] == "FINAL", replies(child)
    if probe != "delegate":
        assert [i["status"] for i in child["background"]] == ["ended"], child["background"]


# ------------------------------------------------------------------------------ kills


def _gated(gate: Path) -> str:
    """A monitor command that ends when the test creates ``gate`` (its own loop, not the test's)."""
    return f"while [ ! -e {gate} ]; do sleep 0.05; done; echo OK"


#: Each signal once local (the parent's environment goes down too) and once remote, in
#: each of the two scenarios below: four restarts are most of these tests' time.
STOPS = [("local", "SIGKILL"), ("remote", "SIGTERM")]


@pytest.mark.parametrize(("where", "stop"), STOPS)
def test_child_environment_stopped_mid_task(
    up: dict[str, Server], tmp_path: Path, where: str, stop: str
) -> None:
    """The child's environment is killed (or stopped) while the codex child's monitor runs;
    the monitor ends while it is down; after the restart the child is woken, its resumed
    Codex session answers, and FINAL reaches the parent exactly once."""
    origin = up["main"]
    child_env = up["peer"] if where == "remote" else origin
    gate = tmp_path / "gate"
    task = plan(
        "a gated monitor",
        start=[tool("monitor_start", command=_gated(gate)), say("WAITING")],
        monitor_finished=[say("FINAL")],
    )
    parent_id = delegate_codex(origin, task, "peer" if where == "remote" else None)

    def waiting() -> dict[str, Any] | None:
        tasks = tasks_of(origin, parent_id)
        if not tasks or not tasks[0]["childThreadId"]:
            return None
        view = thread(child_env, tasks[0]["childThreadId"])
        ran = view["runs"] and view["runs"][0]["status"] == "completed"
        return view if ran and view["background"] and view["background"][0]["status"] == "running" else None

    child = await_on(child_env, waiting, 60, "the codex child to start its monitor and answer WAITING")
    assert replies(child) == [("task", "WAITING")]
    monitor = wrapper_pid(child_env, child["background"][0]["id"])
    child_env.kill() if stop == "SIGKILL" else child_env.stop()
    gate.touch()
    await_exit(monitor)
    child_env.start(timeout=90)

    tasks, parent = await_finished(origin, parent_id, timeout=90)
    assert_delivered_once(tasks, parent)
    child = child_of(origin, parent_id, child_env)
    assert replies(child)[-1] == ("monitor_finished", "FINAL"), replies(child)


def codex_processes(server: Server) -> list[int]:
    """Pids of ``codex`` processes working in ``server``'s workspace (tether's turns)."""
    workspace = (server.data / "workspace").resolve()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if "codex" in (entry / "cmdline").read_text() and (entry / "cwd").resolve() == workspace:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.parametrize(("where", "stop"), [(w, {"SIGKILL": "SIGTERM"}.get(s, "SIGKILL")) for w, s in STOPS])
def test_child_environment_stopped_mid_turn(
    up: dict[str, Server], model: ResponsesServer, tmp_path: Path, where: str, stop: str
) -> None:
    """The child's environment stops while its ``codex exec`` waits for the model. A SIGKILL
    leaves that Codex running with no one to read it: the restart run ends it before it
    resumes the session (no two Codex processes on one session), and FINAL reaches the
    parent exactly once."""
    origin = up["main"]
    child_env = up["peer"] if where == "remote" else origin
    gate, marker = tmp_path / "gate", f"mid-turn {where} {stop}"
    task = plan(marker, start=[{"say": "TOO LATE", "gate": str(gate)}], restart=[say("FINAL")])
    parent_id = delegate_codex(origin, task, "peer" if where == "remote" else None)
    model.await_request(lambda body: marker in json.dumps(body))
    before = codex_processes(child_env)
    assert before, "no codex process while the model thinks"
    child_env.kill() if stop == "SIGKILL" else child_env.stop()
    child_env.start(timeout=90)
    try:
        tasks, parent = await_finished(origin, parent_id, timeout=90)
        assert_delivered_once(tasks, parent)
        assert not [pid for pid in before if is_alive(pid)], "the old codex still runs"
    finally:
        gate.touch()
    child = child_of(origin, parent_id, child_env)
    assert replies(child) == [("task", None), ("restart", "FINAL")], replies(child)


# ------------------------------------------------------------------------------ the CLI's own behaviour


def test_tether_tools_are_approved_and_never_refused(up: dict[str, Server], model: ResponsesServer) -> None:
    """Real ``codex exec`` refuses an MCP tool call that needs approval ("approval policy
    is never"): tether's server is approved in advance, so the call reaches tether."""
    parent_id = delegate_codex(up["main"], MONITOR)
    await_finished(up["main"], parent_id, timeout=90)
    outputs = [
        json.dumps(item)
        for body in model.responses()
        for item in body.get("input", [])
        if item.get("type") == "function_call_output"
    ]
    assert outputs and not [o for o in outputs if "requires approval" in o]


def test_the_shell_sees_neither_the_credential_nor_the_key(
    up: dict[str, Server], model: ResponsesServer
) -> None:
    """The model runs ``env`` with Codex's own shell: neither tether's per-thread MCP
    credential nor the API key is in it — while the same session still calls tether."""
    task = plan("secrets check", start=[{"shell": "env"}, tool("environment_links"), say("DONE <<name>>")])
    parent_id = delegate_codex(up["main"], task)
    tasks, _ = await_finished_any(up["main"], parent_id)
    assert tasks[0]["result"]["text"] == "DONE main"
    outputs = [
        item
        for body in model.responses()
        if "secrets check" in json.dumps(body)
        for item in body.get("input", [])
        if item.get("type") == "function_call_output"
    ]
    shell = [item for item in outputs if "PATH=" in json.dumps(item)]
    assert shell, f"the model never saw the output of env: {outputs}"
    seen = json.dumps(shell[-1])
    assert "TETHER_MCP_TOKEN" not in seen and "ttc_" not in seen  # thread credentials are ttc_…
    assert KEY not in seen and "CODEX_API_KEY" not in seen and KEY_ENV not in seen


def test_messages_on_the_way_are_said_and_tool_activity_is_not(up: dict[str, Server]) -> None:
    thread_id = start_codex(up["main"], plan("on the way", start=[
        {"say": "Looking.", "shell": "echo hi; exit 2"}, {"say": "Still looking.", "tool": "thread_list"},
        say("Done."),
    ]))
    wait_settled(up["main"], thread_id)
    view = thread(up["main"], thread_id)
    assert [(r["status"], r["reply"]) for r in view["runs"]] == [("completed", "Done.")]
    said = [m["text"] for m in view["messages"] if m["role"] == "assistant"]
    assert said == ["Looking.", "Still looking.", "Done."]


def test_a_failed_turn_fails_the_run_with_codexs_message(up: dict[str, Server]) -> None:
    thread_id = start_codex(up["main"], plan("quota", start=[{"fail": "no", "code": "insufficient_quota"}]))
    wait_settled(up["main"], thread_id)
    [run] = thread(up["main"], thread_id)["runs"]
    quota = "Codex: Quota exceeded. Check your plan and billing details."
    assert (run["status"], run["error"]) == ("failed", quota)


def test_tethers_server_is_required(tmp_path: Path, model: ResponsesServer) -> None:
    """The command line tether gives Codex, with tether's MCP server unreachable: the turn
    fails with Codex's reason instead of running without tether's tools."""
    provider = CodexProvider(tomllib.loads(provider_config(model))["providers"]["codex"])
    argv = provider.command(None, f"http://127.0.0.1:{free_port()}/mcp")
    env = {**os.environ, "CODEX_HOME": str(tmp_path), "CODEX_API_KEY": KEY, "TETHER_MCP_TOKEN": "ttc_x"}
    done = subprocess.run(argv, input=plan("required", start=[say("WITHOUT TOOLS")]), env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    events = CodexEvents()
    for line in done.stdout.splitlines():
        events.feed(json.loads(line))
    with pytest.raises(CodexError, match="required MCP servers failed to initialize: tether"):
        events.outcome(done.returncode, done.stderr)
    assert "WITHOUT TOOLS" not in done.stdout


def test_the_default_model_is_in_the_pinned_clis_catalog(tmp_path: Path, model: ResponsesServer) -> None:
    """Codex runs a model missing from its catalog on fallback metadata (with an ``error``
    item saying so) — as it did tether's old default, ``gpt-5-codex``."""
    listed = subprocess.run(
        [str(CODEX), "debug", "models"], env={**os.environ, "CODEX_HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=60, check=True,
    )
    catalog = {entry["slug"] for entry in json.loads(listed.stdout)["models"]}
    assert DEFAULT_MODEL in catalog and "gpt-5-codex" not in catalog


def start_codex(server: Server, text: str, model: str | None = None) -> str:
    """A codex thread of its own (no parent), with the thread's own model when given."""
    with server.client() as client:
        created = client.post("/api/threads", json={"provider": "codex", "message": text, "model": model})
    assert created.status_code == 201, created.text
    return str(created.json()["threadId"])


@pytest.mark.parametrize(
    ("notice", "model_name", "step"),
    [
        ("an unknown model's fallback, before turn.started", "gpt-5-codex", say("NOTED")),
        ("a reconnect after a broken stream", None, {"say": "NOTED", "drop": 1}),
    ],
)
def test_codex_notices_are_not_failures(
    up: dict[str, Server], model: ResponsesServer, notice: str, model_name: str | None, step: dict[str, Any]
) -> None:
    """Codex reports notices as ``error`` items, some before ``turn.started``: the turn
    still completes with its reply. The thread's own model reaches Codex."""
    marker = f"notice {len(model.requests)}"
    thread_id = start_codex(up["main"], plan(marker, start=[step]), model_name)
    wait_settled(up["main"], thread_id)
    [run] = thread(up["main"], thread_id)["runs"]
    assert (run["status"], run["reply"], run["error"]) == ("completed", "NOTED", None), (notice, run)
    sent = [body for body in model.responses() if marker in json.dumps(body)]
    assert {body["model"] for body in sent} == {model_name or DEFAULT_MODEL}
    if "drop" in step:
        assert len(sent) == 2  # the broken stream and the retry


def test_usage_is_the_sessions_running_total(up: dict[str, Server], model: ResponsesServer) -> None:
    """``turn.completed.usage`` of the real CLI counts the whole session: after a resumed
    turn, the total tether keeps equals the usage of every response of the session."""
    marker = f"usage {len(model.requests)}"
    main = up["main"]
    thread_id = start_codex(main, plan(marker, start=[say("FIRST")], again=[say("SECOND")]))
    wait_settled(main, thread_id)
    first = _codex_state(main, thread_id)["usage"]
    with main.client() as client:
        assert client.post(f"/api/threads/{thread_id}/messages", json={"text": "again"}).status_code == 200
    wait_settled(main, thread_id)
    assert [r["reply"] for r in thread(main, thread_id)["runs"]] == ["FIRST", "SECOND"]
    state = _codex_state(main, thread_id)
    sent = [b for b in model.responses() if b.get("prompt_cache_key") == state["sessionId"]]
    assert len(sent) == 2
    assert state["usage"]["input_tokens"] == sum(100 + 10 * len(b["input"]) for b in sent)
    assert state["usage"]["input_tokens"] > first["input_tokens"]


def _codex_state(server: Server, thread_id: str) -> dict[str, Any]:
    """The thread's ``codex`` state, read from the environment's SQLite file (read-only)."""
    with sqlite3.connect(f"file:{server.data / 'tether.db'}?mode=ro", uri=True, timeout=5) as conn:
        [data] = conn.execute("SELECT data FROM threads WHERE id = ?", (thread_id,)).fetchone()
    return dict(json.loads(data)["state"]["codex"])


def await_finished_any(origin: Server, parent_id: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Until the child's task is delivered and the parent settled, whatever the result."""
    def check() -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
        tasks, parent = tasks_of(origin, parent_id), thread(origin, parent_id)
        done = tasks and parent["settled"] and all(t["delivery"]["state"] == "acknowledged" for t in tasks)
        return (tasks, parent) if done else None

    return await_on(origin, check, 90, f"the child of {parent_id} to be delivered")
