"""The ``claude`` provider: Claude Code, driven through the Claude Agent SDK.

Each thread keeps **one live SDK session** — one Claude Code process — from its first run
until tether shuts down. It is never closed at a ``ResultMessage``: closing kills the CLI
and the background work it runs, whose finish notices then never come (the known trap).
A restarted tether resumes the conversation from the session id kept in the thread's
state (``{"claude": {"sessionId": ...}}``).

Claude Code runs background work itself (background Bash, Monitor). tether mirrors it so
that the thread's task does not settle around it, and so that its end wakes the thread:

- ``task_started`` (a background shell or monitor) → a background item tether does not
  spawn (``start_process(..., spawn=False)``), labelled with the CLI's task id;
- its end — a ``task_notification`` (completed | failed | stopped), or a ``task_updated``
  reaching completed | failed | killed when no notification comes — → ``process_ended``,
  exactly once per task: the item ends and its wake run is queued in one transaction (G2).

Claude Code meanwhile starts its own turn for that end (``ResultMessage.origin.kind ==
"task-notification"``). When tether runs the wake run, the provider sends no prompt: the
run takes that self-started turn's output (its text, said as the run's messages, and its
result, the run's reply). One reader per session reads every message, between runs too,
and splits them into turns, which runs then claim:

- a prompted run (user, task, message, and wakes of work tether runs itself) sends its
  text with a fresh uuid and claims the turn whose result lists that uuid — skipping the
  CLI's own turns, which stay for their wake runs (a wake can arrive while a user message
  is queued: tether runs that message first, the CLI its own turn first);
- a wake run claims the CLI's own turns not yet claimed, oldest first, until the CLI says
  it is ``idle`` after the task's end (turns of monitor events no run asked for come along);
  if it says so with no such turn — the notice went into a turn that was running — the run
  claims none and repeats the latest reply, so that the answer stays the last reply. A CLI
  that reports no session state gets ``wake_grace_s`` to begin its turn.

Not mirrored: a foreground Bash the CLI reports as a task (``is_backgrounded: false``) and
work a subagent started (``owned_by_subagent``); a background subagent is an ``agent`` item.
A Monitor's events are turns the CLI starts itself whose monitor and lines only the
transcript names: they become the monitor's output, and its ``monitor_event`` runs take them.

After a stop of tether the CLI lives on (it runs under ``SHIM``) while it has background
work; on start, ``adopt`` waits for it to exit and ends its items as its transcript says,
and each wake run takes the turn the CLI wrote (:mod:`.transcript`).

A user message that arrives while a wake is pending queues behind it: tether runs one run
at a time per thread, and the prompt is sent only when its run starts.

Every session gets tether's MCP server (``/mcp`` of this environment) with a per-thread
credential minted here, in a ``--mcp-config`` file readable by tether's user only.
"""
