"""Background processes: the shared manager and one backend per platform (SPEC §13)."""

from __future__ import annotations

import os
import sys

from tether.engine.processes.base import ProcessBackend, ProcessManager
from tether.engine.processes.linux import LinuxBackend, pidfd_works
from tether.engine.processes.portable import PortableBackend

__all__ = [
    "LinuxBackend",
    "PortableBackend",
    "ProcessBackend",
    "ProcessManager",
    "choose_backend",
    "process_start_time",
]

#: Names of the portable backend on the platforms it is the native choice for.
_NATIVE = {"darwin": "macos", "win32": "windows"}


def choose_backend(choice: str | None = None, platform: str = sys.platform) -> ProcessBackend:
    """The backend for this platform: Linux (with pidfd) gets ``linux``, macOS and Windows
    the portable backend under their names, anything else the portable one.
    ``TETHER_PROCESSES=portable`` (or ``choice``) forces the portable backend, ``linux``
    the Linux one."""
    choice = (choice if choice is not None else os.environ.get("TETHER_PROCESSES", "")).strip().lower()
    linux = platform.startswith("linux")
    if choice == "portable":
        return PortableBackend("portable", platform)
    if choice == "linux":
        if not (linux and pidfd_works()):
            raise ValueError("TETHER_PROCESSES=linux needs Linux 5.3 or later (pidfd)")
        return LinuxBackend()
    if choice not in ("", "auto"):
        raise ValueError(f"TETHER_PROCESSES={choice!r}: expected 'linux', 'portable' or nothing")
    if linux and pidfd_works():
        return LinuxBackend()
    return PortableBackend(_NATIVE.get(platform, "portable"), platform)


def process_start_time(pid: int) -> str | None:
    """``pid``'s start stamp under the backend in use, or None if it is gone: what tells a
    process an agent CLI started from a later one that reused its pid."""
    return choose_backend().identity(pid)
