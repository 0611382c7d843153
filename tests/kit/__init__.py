"""The one test kit every test directory shares: real ``tether serve`` processes and their
teardown (``servers``), the API calls tests make (``api``), links between environments
(``links``), reading completion wakes (``wakes``), background processes (``processes``)
and the one bounded poll (``waits``). Directory-specific helpers (probe runners, the
stress ledger, the browser) build on it and live beside their tests."""

from kit.api import env_id, new_thread, tasks_of, thread, wait_settled
from kit.links import link, link_status, links, mint
from kit.processes import (
    await_exit,
    is_alive,
    kill_group,
    leftover_wrappers,
    live_wrappers,
    process_gone,
    reap,
    reap_zombie_children,
    recorded_exit,
    recorded_pid,
    set_subreaper,
    wrapper_pid,
)
from kit.servers import LoggedServer, Servers, shutdown, start_all
from kit.waits import poll
from kit.wakes import finals, reported, runs_of, wake_entries, wake_messages, wake_runs

__all__ = [
    "LoggedServer",
    "Servers",
    "await_exit",
    "env_id",
    "finals",
    "is_alive",
    "kill_group",
    "leftover_wrappers",
    "link",
    "link_status",
    "links",
    "live_wrappers",
    "mint",
    "new_thread",
    "poll",
    "process_gone",
    "reap",
    "reap_zombie_children",
    "recorded_exit",
    "recorded_pid",
    "reported",
    "runs_of",
    "set_subreaper",
    "shutdown",
    "start_all",
    "tasks_of",
    "thread",
    "wait_settled",
    "wake_entries",
    "wake_messages",
    "wake_runs",
    "wrapper_pid",
]
