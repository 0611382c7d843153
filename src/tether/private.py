"""Files only their owner may read (the admin token, agents' credentials), per platform.

POSIX: mode 0600. Windows ignores POSIX modes (``os.open``'s mode only sets read-only),
so there the file is created empty, its inherited access list is replaced by one entry
for the current user (``icacls``), and only then is the secret written into it.
"""

from __future__ import annotations

import getpass
import logging
import os
import subprocess
import sys
from pathlib import Path

log = logging.getLogger(__name__)


def write_private(path: Path, text: str, platform: str = sys.platform) -> None:
    """Write ``text`` to ``path`` readable and writable by its owner only."""
    if platform == "win32":
        path.write_text("")
        _owner_only(path)
        path.write_text(text)
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # also when the file existed with a wider mode
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def _owner_only(path: Path) -> None:
    """Drop inherited permissions and grant full control to the current user only."""
    command = ["icacls", str(path), "/inheritance:r", "/grant:r", f"{getpass.getuser()}:F"]
    try:
        subprocess.run(command, check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as error:
        log.warning("could not restrict %s to its owner (%s): keep its directory private", path, error)
