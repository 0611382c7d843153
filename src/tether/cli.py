"""The ``tether`` command line: serve an environment, talk to one, run the demo."""

from __future__ import annotations

import asyncio
import json
import os
import sys
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

UrlOpt = typer.Option(
    os.environ.get("TETHER_URL", DEFAULT_URL), "--url", help="Environment URL (TETHER_URL)."
)
TokenOpt = typer.Option(None, "--token", help="Bearer token (TETHER_TOKEN; default: DATA/admin.token).")
DataOpt = typer.Option(None, "--data", help="Data directory whose admin.token to use.")
JsonOpt = typer.Option(False, "--json", help="Print JSON.")


def _client(url: str, token: str | None, data: Path | None, timeout: float = 60.0) -> Client:
    return Client(url, resolve_token(token, data), timeout)


def _call(fn: Any) -> Any:
    try:
        return fn()
    except ApiError as error:
        err.print(f"[red]error[/red] {error.status} {error.code}: {error.message}")
        raise typer.Exit(1) from None
    except Exception as error:  # connection refused and the like
        err.print(f"[red]error[/red] {type(error).__name__}: {error}")
        raise typer.Exit(1) from None


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
def thread_new(
    message: str = typer.Argument(None, help="First message (for the script provider: the script)."),
    provider: str = typer.Option("script", "--provider"),
    title: str | None = typer.Option(None, "--title"),
    file: Path | None = typer.Option(None, "--file", help="Read the first message from a file."),
    url: str = UrlOpt,
    token: str | None = TokenOpt,
    data: Path | None = DataOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Create a thread (and start its first run if a message is given)."""
    text = file.read_text() if file else message
    client = _client(url, token, data)
    result = _call(
        lambda: client.post("/api/threads", {"provider": provider, "title": title, "message": text})
    )
    _print_json(result) if as_json else out.print(
        f"thread [bold]{result['threadId']}[/bold] run {result['runId']}"
    )


@thread_app.command("send")
def thread_send(
    thread_id: str,
    text: str,
    mode: str = typer.Option("auto", "--mode", help="auto or queue"),
    url: str = UrlOpt,
    token: str | None = TokenOpt,
    data: Path | None = DataOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Send a message to a thread."""
    client = _client(url, token, data)
    result = _call(lambda: client.post(f"/api/threads/{thread_id}/messages", {"text": text, "mode": mode}))
    _print_json(result) if as_json else out.print(
        f"message {result['messageId']} run {result['runId']} ({result['delivery']})"
    )


@thread_app.command("show")
def thread_show(
    thread_id: str,
    url: str = UrlOpt,
    token: str | None = TokenOpt,
    data: Path | None = DataOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Show a thread: its messages, runs and background work."""
    client = _client(url, token, data)
    view = _call(lambda: client.get(f"/api/threads/{thread_id}"))
    if as_json:
        _print_json(view)
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
def thread_wait(
    thread_id: str,
    until_settled: bool = typer.Option(False, "--settled", help="Wait until settled, not just idle."),
    after_run: str | None = typer.Option(None, "--after-run"),
    timeout_ms: int = typer.Option(300_000, "--timeout-ms"),
    url: str = UrlOpt,
    token: str | None = TokenOpt,
    data: Path | None = DataOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Wait until a thread is idle (or settled)."""
    client = _client(url, token, data, timeout=timeout_ms / 1000 + 30)
    with err.status(f"waiting for {thread_id}…"):
        result = _call(
            lambda: client.get(
                f"/api/threads/{thread_id}/wait",
                untilSettled=until_settled,
                afterRunId=after_run,
                timeoutMs=timeout_ms,
            )
        )
    if as_json:
        _print_json(result)
    else:
        state = "timed out" if result["timedOut"] else ("settled" if result["settled"] else result["status"])
        out.print(f"{thread_id}: {state} (last run {result['runId']})")
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
def task_list(
    parent: str | None = typer.Option(None, "--parent", help="Only tasks of this parent thread."),
    status: str | None = typer.Option(None, "--status"),
    url: str = UrlOpt,
    token: str | None = TokenOpt,
    data: Path | None = DataOpt,
    as_json: bool = JsonOpt,
) -> None:
    """List delegated tasks and follow-ups."""
    client = _client(url, token, data)
    result = _call(lambda: client.get("/api/tasks", parentThreadId=parent, status=status))
    _print_json(result) if as_json else out.print(_task_table(result["tasks"]))


@task_app.command("show")
def task_show(
    task_id: str,
    url: str = UrlOpt,
    token: str | None = TokenOpt,
    data: Path | None = DataOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Show one task."""
    client = _client(url, token, data)
    result = _call(lambda: client.get(f"/api/tasks/{task_id}"))
    _print_json(result) if as_json else out.print(_task_table([result]))


@task_app.command("cancel")
def task_cancel(
    task_id: str,
    reason: str | None = typer.Option(None, "--reason"),
    url: str = UrlOpt,
    token: str | None = TokenOpt,
    data: Path | None = DataOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Cancel a task: its child stops, and the parent is told once."""
    client = _client(url, token, data)
    result = _call(lambda: client.post(f"/api/tasks/{task_id}/cancel", {"reason": reason}))
    _print_json(result) if as_json else out.print(f"{result['taskId']}: {result['status']}")


# ---------------------------------------------------------------------- tokens and links


@token_app.command("create")
def token_create(
    label: str = typer.Option(..., "--label", help="Who the token is for (shown in lists)."),
    url: str = UrlOpt,
    token: str | None = TokenOpt,
    data: Path | None = DataOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Mint a link token. It is shown once: it is as powerful as an SSH key to this workspace."""
    client = _client(url, token, data)
    result = _call(lambda: client.post("/api/link-tokens", {"label": label}))
    if as_json:
        _print_json(result)
    else:
        out.print(f"link token {result['tokenId']} ({label}) — shown once, keep it secret:")
        sys.stdout.write(result["token"] + "\n")


@token_app.command("list")
def token_list(
    url: str = UrlOpt, token: str | None = TokenOpt, data: Path | None = DataOpt, as_json: bool = JsonOpt
) -> None:
    """List link tokens (never the secrets)."""
    client = _client(url, token, data)
    result = _call(lambda: client.get("/api/link-tokens"))
    if as_json:
        _print_json(result)
        return
    table = Table("token", "label", "created", "last used", "revoked")
    for t in result["tokens"]:
        table.add_row(
            t["tokenId"], t["label"], t["createdAt"], t["lastUsedAt"] or "", "yes" if t["revoked"] else ""
        )
    out.print(table)


@token_app.command("revoke")
def token_revoke(
    token_id: str,
    url: str = UrlOpt,
    token: str | None = TokenOpt,
    data: Path | None = DataOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Revoke a link token: every later call with it gets 401."""
    client = _client(url, token, data)
    result = _call(lambda: client.request("DELETE", f"/api/link-tokens/{token_id}"))
    _print_json(result) if as_json else out.print(f"{token_id} revoked")


@link_app.command("add")
def link_add(
    peer_url: str = typer.Argument(..., help="URL of the environment to link to."),
    peer_token: str = typer.Option(..., "--token", help="A link token minted there."),
    label: str | None = typer.Option(None, "--label"),
    insecure: bool = typer.Option(False, "--insecure", help="Allow plain http to a public address."),
    url: str = UrlOpt,
    admin_token: str | None = typer.Option(None, "--admin-token", help="This environment's token."),
    data: Path | None = DataOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Link this environment to the one at PEER_URL."""
    client = _client(url, admin_token, data)
    body = {"url": peer_url, "token": peer_token, "label": label, "insecure": insecure}
    result = _call(lambda: client.post("/api/links", body))
    _print_json(result) if as_json else out.print(f"linked to {result['name']} ({result['environmentId']})")


@link_app.command("list")
def link_list(
    url: str = UrlOpt, token: str | None = TokenOpt, data: Path | None = DataOpt, as_json: bool = JsonOpt
) -> None:
    """List links with their reachability and last error."""
    client = _client(url, token, data)
    result = _call(lambda: client.get("/api/links"))
    if as_json:
        _print_json(result)
        return
    table = Table("environment", "name", "label", "url", "status", "last error")
    for link in result["links"]:
        table.add_row(
            link["environmentId"],
            link["name"],
            link["label"] or "",
            link["url"],
            link["status"],
            link["lastError"] or "",
        )
    out.print(table)


def main() -> None:
    app()
