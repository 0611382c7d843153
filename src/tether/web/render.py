"""Jinja2 templates of the web page, and the fragments the live feed and actions send.

A fragment is ``{id, html, container, order}``: the element with ``id`` is replaced by
``html``, or, when it is not on the page (or sits in another container), ``html`` is put
into ``container`` at its place by ``order``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape

from tether.web import model

TEMPLATES = Path(__file__).parent / "templates"

jinja = Environment(
    loader=FileSystemLoader(TEMPLATES),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)
jinja.globals.update(elapsed=model.elapsed, short=model.short, titles=model.GROUP_TITLES)


def render(template: str, **context: Any) -> str:
    return jinja.get_template(template).render(**context)


def fragment(
    template: str, id: str, container: str | None, order: str | None, **context: Any
) -> dict[str, Any]:
    return {"id": id, "html": render(template, **context), "container": container, "order": order}


def thread_model(
    view: dict[str, Any], ctx: model.Context, own_task: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Everything the thread page shows, from one thread view."""
    return {
        "head": model.thread_head(view, ctx, own_task),
        "entries": model.timeline(view, ctx),
        "background": model.background_rows(view, ctx),
        "ledger": model.ledger_rows(view, ctx),
    }


def thread_fragments(
    page: dict[str, Any], keys: set[tuple[str, ...]] | None, **context: Any
) -> list[dict[str, Any]]:
    """The fragments of a thread page named by ``keys`` (all of them for None)."""
    found: list[dict[str, Any]] = []

    def wanted(key: tuple[str, ...]) -> bool:
        return keys is None or key in keys

    head = page["head"]
    if wanted(("head",)):
        found.append(fragment("partials/thread_head.html", head["id"], None, None, head=head, **context))
    for entry in page["entries"]:
        if entry["kind"] == "run":
            entry_keys = [("run", entry["run"]["runId"])]
        elif entry["kind"] == "task":
            entry_keys = [("task", entry["task"]["taskId"])]
        elif entry["kind"] == "monitor":
            entry_keys = [("item", entry["itemId"])] + [("run", run_id) for run_id in entry["runIds"]]
        else:
            continue
        if any(wanted(key) for key in entry_keys):
            found.append(
                fragment(
                    "partials/entry.html",
                    entry["id"],
                    entry["container"],
                    entry["order"],
                    entry=entry,
                    **context,
                )
            )
    for row in page["background"]:
        if wanted(("item", row["itemId"])) or (row["taskId"] and keys and ("task", row["taskId"]) in keys):
            found.append(
                fragment(
                    "partials/item_row.html", row["id"], row["container"], row["order"], row=row, **context
                )
            )
    for row in page["ledger"]:
        if wanted(("ledger", row["taskId"])):
            found.append(
                fragment(
                    "partials/ledger_row.html", row["id"], row["container"], row["order"], row=row, **context
                )
            )
    return found


def row_fragment(row: dict[str, Any]) -> dict[str, Any]:
    return fragment("partials/thread_row.html", row["id"], row["container"], row["order"], row=row)
