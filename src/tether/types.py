"""Types shared across layers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Caller:
    """Who is asking. Every task and thread is bound to this, never to a transport session.

    - ``admin``: the environment's admin token; reaches everything.
    - ``link``: a peer holding a link token; reaches only what that token created (G10).
    - ``thread``: an agent thread acting through its tools (a provider turn, or an MCP
      client holding the thread's credential).
    """

    kind: str
    token_id: str | None = None
    thread_id: str | None = None
    run_id: str | None = None
    #: ``{environmentId, threadId, taskId?}`` a link call says it acts for.
    origin: dict[str, Any] | None = None

    @property
    def scope(self) -> str:
        """The idempotency scope: a clientRequestId is unique per caller."""
        return f"{self.kind}:{self.token_id or ''}:{self.thread_id or ''}"


ADMIN = Caller("admin")
