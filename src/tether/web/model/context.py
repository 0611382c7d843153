"""What every part of the page shares: where a view comes from (:class:`Context`), the
attention groups' words, and short texts for times and lines."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from tether.ids import parse_time

GROUP_TITLES = {
    "needs_input": "Needs input",
    "working": "Working",
    "waiting": "Waiting",
    "failed": "Failed",
    "settled": "Settled",
}
GROUP_HINTS = {
    "needs_input": "only a person can move these on",
    "working": "a run is queued or running",
    "waiting": "idle, but held work or open tasks will wake them",
    "failed": "the last run failed; nothing will wake them",
    "settled": "finished; nothing will wake them",
}
OPEN = ("queued", "running")


@dataclass
class Context:
    """Where a view comes from, and how to link to threads from there.

    ``here`` is the environment whose records the view shows; ``local`` is the environment
    serving the page; ``linked`` are the environments it links to (id → name).
    """

    local: str
    local_name: str
    linked: dict[str, str] = field(default_factory=dict)
    here: str | None = None

    @property
    def source(self) -> str:
        return self.here or self.local

    @property
    def remote(self) -> bool:
        return self.source != self.local

    def name(self, environment_id: str | None) -> str:
        if not environment_id or environment_id == self.local:
            return self.local_name
        return self.linked.get(environment_id, environment_id)

    def thread_href(self, environment_id: str | None, thread_id: str | None) -> str | None:
        """A link to a thread wherever it lives: here, or through a link of this server."""
        if not thread_id:
            return None
        environment_id = environment_id or self.source
        if environment_id == self.local:
            return f"/threads/{thread_id}"
        if environment_id in self.linked:
            return f"/env/{environment_id}/threads/{thread_id}"
        return None


def elapsed(start: str | None, end: str | None = None, now: datetime | None = None) -> str:
    """``"4 s"``, ``"3 min 2 s"``, ``"2 h 5 min"``."""
    if not start:
        return ""
    stop = parse_time(end) if end else (now or datetime.now(UTC))
    return seconds_text((stop - parse_time(start)).total_seconds())


def seconds_text(seconds: float) -> str:
    total = max(0, int(seconds))
    if total < 60:
        return f"{total} s"
    if total < 3600:
        return f"{total // 60} min {total % 60} s"
    return f"{total // 3600} h {total % 3600 // 60} min"


def short(text: str | None, limit: int = 120) -> str:
    if not text:
        return ""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
