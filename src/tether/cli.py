"""The ``tether`` command line: serve an environment, talk to one, run the demo."""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from tether.client import DEFAULT_URL, ApiError, Client, resolve_token

app = typer.Typer(
    help="tether: delegate work between agent threads and never lose an answer.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
thread_app = typer.Typer(help="Create, message, show and wait on threads.", no_args_is_help=True)
task_app = typer.Typer(help="List, show and cancel delegated tasks.", no_args_is_help=True)
token_app = typer.Typer(help="Link tokens this environment mints for peers.", no_args_is_help=True)
link_app = typer.Typer(help="Links from this environment to others.", no_args_is_help=True)
app.add_typer(thread_app, name="thread")
app.add_typer(task_app, name="task")
app.add_typer(token_app, name="token")
app.add_typer(link_app, name="link")

out = Console()
err = Console(stderr=True)

JsonOpt = typer.Option(False, "--json", help="Print JSON.")


@dataclass
class Conn:
    """The connection options every command that talks to an environment takes, declared
    once by :func:`connected`."""

    url: str
    token: str | None
    data: Path | None
    as_json: bool

    def get(self, path: str, timeout: float = 60.0, **params: Any) -> Any:
        return self._call(lambda client: client.get(path, **params), timeout)

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self._call(lambda client: client.post(path, body))

    def delete(self, path: str) -> Any:
        return self._call(lambda client: client.request("DELETE", path))

    def _call(self, send: Callable[[Client], Any], timeout: float = 60.0) -> Any:
        """One API call; an error is printed and the command exits 1."""
        try:
            return send(Client(self.url, resolve_token(self.token, self.data), timeout))
        except ApiError as error:
            err.print(f"[red]error[/red] {error.status} {error.code}: {error.message}")
            raise typer.Exit(1) from None
        except Exception as error:  # connection refused and the like
            err.print(f"[red]error[/red] {type(error).__name__}: {error}")
            raise typer.Exit(1) from None

    def show(self, result: Any, text: str | Table | None = None) -> None:
        """``--json``: the API's answer as is; otherwise ``text`` for a person."""
        if self.as_json or text is None:
            _print_json(result)
        else:
            out.print(text)


def connected(token_flag: str = "--token") -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command ``--url``, ``--token`` (or ``token_flag``), ``--data`` and ``--json``,
    passed to it as ``conn``: the options are declared here only, not in every command."""
    added = [
        _option(
            "url", str, os.environ.get("TETHER_URL", DEFAULT_URL), "--url", "Environment URL (TETHER_URL)."
        ),
        _option(
            "token", str | None, None, token_flag, "Bearer token (TETHER_TOKEN; default: DATA/admin.token)."
        ),
        _option("data", Path | None, None, "--data", "Data directory whose admin.token to use."),
        _option("as_json", bool, False, "--json", "Print JSON."),
    ]

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "conn"]

        @functools.wraps(command)
        def run(
            *args: Any, url: str, token: str | None, data: Path | None, as_json: bool, **kwargs: Any
        ) -> None:
            command(*args, conn=Conn(url, token, data, as_json), **kwargs)

        parameters = own + added
        run.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in parameters}
        return run

    return decorate


def _option(name: str, annotation: Any, default: Any, flag: str, help: str) -> inspect.Parameter:
    option = typer.Option(default, flag, help=help)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2) + "\n")


@app.command()
def serve(
    data: Path = typer.Option(Path("./tether-data"), "--data", help="Data directory."),
    port: int = typer.Option(8765, "--port"),
    host: str = typer.Option("127.0.0.1", "--host"),
    name: str | None = typer.Option(None, "--name", help="Human name of this environment."),
    store: str | None = typer.Option(
        None,
        "--store",
        envvar="TETHER_STORE",
        help="Where the environment lives: postgresql://USER@HOST/DB, shared by every process "
        "serving it (SPEC §12). Default: DATA/tether.db (SQLite).",
    ),
) -> None:
    """Serve one environment over HTTP (admin token in DATA/admin.token)."""
    from tether.engine.processes import choose_backend
    from tether.server import serve as run
    from tether.store import backend_of

    try:
        choose_backend()  # a wrong TETHER_PROCESSES is said plainly, before anything starts
        if store:
            backend_of(store)  # and so is a store tether cannot open
    except ValueError as error:
        err.print(f"[red]error[/red] {error}")
        raise typer.Exit(2) from None
    asyncio.run(run(data, port, host, name, store))


@app.command()
def demo(
    as_json: bool = JsonOpt,
    data: Path | None = typer.Option(None, "--data", help="Keep the environments' data here."),
    probes: str = typer.Option("1,2,3,4,5,6", "--probes", help="Which probes to run."),
) -> None:
    """Start two environments on loopback and run the six probes, local and remote."""
    from tether.demo import print_table, run_demo

    rows = run_demo(data, [int(p) for p in probes.split(",") if p.strip()], err)
    if as_json:
        _print_json(rows)
    else:
        print_table(rows, out)
    if not all(row["delivered"] for row in rows):
        raise typer.Exit(1)


@app.command()
def providers(
    data: Path = typer.Option(Path("./tether-data"), "--data", help="Data directory (its config.toml)."),
    as_json: bool = JsonOpt,
) -> None:
    """List providers and whether each is usable here (and why not)."""
    from tether.config import load_config
    from tether.providers import load_providers, usability

    rows = usability(load_providers(load_config(data)))
    if as_json:
        _print_json(rows)
        return
    table = Table("provider", "usable", "why not")
    for row in rows:
        table.add_row(row["provider"], "yes" if row["usable"] else "[red]no[/red]", row["reason"] or "")
    out.print(table)


# ---------------------------------------------------------------------- threads


@thread_app.command("new")
@connected()
def thread_new(
    message: str = typer.Argument(None, help="First message (for the script provider: the script)."),
    provider: str = typer.Option("script", "--provider"),
    title: str | None = typer.Option(None, "--title"),
    file: Path | None = typer.Option(None, "--file", help="Read the first message from a file."),
    *,
    conn: Conn,
) -> None:
    """Create a thread (and start its first run if a message is given)."""
    text = file.read_text() if file else message
    result = conn.post("/api/threads", {"provider": provider, "title": title, "message": text})
    conn.show(result, f"thread [bold]{result['threadId']}[/bold] run {result['runId']}")


@thread_app.command("send")
@connected()
def thread_send(
    thread_id: str,
    text: str,
    mode: str = typer.Option("auto", "--mode", help="auto, queue, or now (stops the running run)"),
    *,
    conn: Conn,
) -> None:
    """Send a message to a thread."""
    result = conn.post(f"/api/threads/{thread_id}/messages", {"text": text, "mode": mode})
    conn.show(result, f"message {result['messageId']} run {result['runId']} ({result['delivery']})")


@thread_app.command("show")
@connected()
def thread_show(thread_id: str, *, conn: Conn) -> None:
    """Show a thread: its messages, runs and background work."""
    view = conn.get(f"/api/threads/{thread_id}")
    if conn.as_json:
        conn.show(view)
        return
    out.print(
        f"[bold]{view['threadId']}[/bold] {view['provider']} · {view['status']} · "
        f"{'settled' if view['settled'] else 'not settled'}"
    )
    table = Table("#", "role", "text", "run", title="messages")
    for m in view["messages"]:
        table.add_row(str(m["position"]), m["role"], m["text"][:200], m["runId"] or "")
    out.print(table)
    runs = Table("run", "trigger", "status", "reply", title="runs")
    for r in view["runs"]:
        runs.add_row(r["runId"], r["trigger"]["kind"], r["status"], (r["reply"] or r["error"] or "")[:80])
    out.print(runs)
    if view["background"]:
        items = Table("item", "kind", "status", "held", "what", title="background")
        for i in view["background"]:
            items.add_row(
                i["id"],
                i["kind"],
                i["status"],
                "yes" if i["held"] else "",
                i["command"] or i["text"] or i["taskId"] or "",
            )
        out.print(items)


@thread_app.command("wait")
@connected()
def thread_wait(
    thread_id: str,
    until_settled: bool = typer.Option(False, "--settled", help="Wait until settled, not just idle."),
    after_run: str | None = typer.Option(None, "--after-run"),
    timeout_ms: int = typer.Option(300_000, "--timeout-ms"),
    *,
    conn: Conn,
) -> None:
    """Wait until a thread is idle (or settled)."""
    with err.status(f"waiting for {thread_id}…"):
        result = conn.get(
            f"/api/threads/{thread_id}/wait",
            timeout=timeout_ms / 1000 + 30,
            untilSettled=until_settled,
            afterRunId=after_run,
            timeoutMs=timeout_ms,
        )
    state = "timed out" if result["timedOut"] else ("settled" if result["settled"] else result["status"])
    conn.show(result, f"{thread_id}: {state} (last run {result['runId']})")
    if result["timedOut"]:
        raise typer.Exit(2)


# ---------------------------------------------------------------------- tasks


def _task_table(tasks: list[dict[str, Any]]) -> Table:
    table = Table("task", "title", "status", "work", "deadline", "result", "follow-up of", "delivery")
    for t in tasks:
        result = (t.get("result") or {}).get("text")
        table.add_row(
            t["taskId"],
            t.get("title") or "",
            t["status"],
            t["workState"],
            _deadline_cell(t),
            (result or "")[:60],
            t.get("followUpOf") or "",
            t["delivery"]["state"],
        )
    return table


def _deadline_cell(task: dict[str, Any]) -> str:
    """``OVERDUE`` once the deadline passed while the task was open (SPEC §11), else when
    it falls due, and what it will do then."""
    if task.get("overdue"):
        return "[bold red]OVERDUE[/]"
    if task.get("deadlineAt"):
        return f"{task['deadlineAt']} ({task.get('onDeadline') or 'wake'})"
    return ""


@task_app.command("list")
@connected()
def task_list(
    parent: str | None = typer.Option(None, "--parent", help="Only tasks of this parent thread."),
    status: str | None = typer.Option(None, "--status"),
    *,
    conn: Conn,
) -> None:
    """List delegated tasks and follow-ups."""
    result = conn.get("/api/tasks", parentThreadId=parent, status=status)
    conn.show(result, _task_table(result["tasks"]))


@task_app.command("show")
@connected()
def task_show(task_id: str, *, conn: Conn) -> None:
    """Show one task."""
    result = conn.get(f"/api/tasks/{task_id}")
    conn.show(result, _task_table([result]))


@task_app.command("cancel")
@connected()
def task_cancel(
    task_id: str,
    reason: str | None = typer.Option(None, "--reason"),
    *,
    conn: Conn,
) -> None:
    """Cancel a task: its child stops, and the parent is told once."""
    result = conn.post(f"/api/tasks/{task_id}/cancel", {"reason": reason})
    conn.show(result, f"{result['taskId']}: {result['status']}")


# ---------------------------------------------------------------------- tokens and links


@token_app.command("create")
@connected()
def token_create(
    label: str = typer.Option(..., "--label", help="Who the token is for (shown in lists)."),
    *,
    conn: Conn,
) -> None:
    """Mint a link token. It is shown once: it is as powerful as an SSH key to this workspace."""
    result = conn.post("/api/link-tokens", {"label": label})
    if conn.as_json:
        conn.show(result)
    else:
        out.print(f"link token {result['tokenId']} ({label}) — shown once, keep it secret:")
        sys.stdout.write(result["token"] + "\n")


@token_app.command("list")
@connected()
def token_list(*, conn: Conn) -> None:
    """List link tokens (never the secrets)."""
    result = conn.get("/api/link-tokens")
    table = Table("token", "label", "created", "last used", "revoked")
    for t in result["tokens"]:
        table.add_row(
            t["tokenId"], t["label"], t["createdAt"], t["lastUsedAt"] or "", "yes" if t["revoked"] else ""
        )
    conn.show(result, table)


@token_app.command("revoke")
@connected()
def token_revoke(token_id: str, *, conn: Conn) -> None:
    """Revoke a link token: every later call with it gets 401."""
    result = conn.delete(f"/api/link-tokens/{token_id}")
    conn.show(result, f"{token_id} revoked")


@link_app.command("add")
@connected(token_flag="--admin-token")
def link_add(
    peer_url: str = typer.Argument(..., help="URL of the environment (or A2A agent) to link to."),
    peer_token: str | None = typer.Option(
        None, "--token", help="A link token minted there (an A2A agent: its Bearer token, if any)."
    ),
    label: str | None = typer.Option(
        None, "--label", "--name", help="The link's name (A2A: else the card's)."
    ),
    a2a: bool = typer.Option(False, "--a2a", help="PEER_URL is an A2A agent (its agent card answers there)."),
    insecure: bool = typer.Option(False, "--insecure", help="Allow plain http to a public address."),
    *,
    conn: Conn,
) -> None:
    """Link this environment to the one at PEER_URL, or (--a2a) to the A2A agent there."""
    kind = "a2a" if a2a else "tether"
    body = {"url": peer_url, "token": peer_token, "label": label, "insecure": insecure, "kind": kind}
    result = conn.post("/api/links", body)
    conn.show(result, f"linked to {result['name']} ({result['environmentId']})")


@link_app.command("list")
@connected()
def link_list(*, conn: Conn) -> None:
    """List links with their reachability and last error."""
    result = conn.get("/api/links")
    table = Table("environment", "kind", "name", "label", "url", "status", "last error")
    for link in result["links"]:
        table.add_row(
            link["environmentId"],
            link.get("kind", "tether"),
            link["name"],
            link["label"] or "",
            link["url"],
            link["status"],
            link["lastError"] or "",
        )
    conn.show(result, table)


def main() -> None:
    app()
