"""An exclusive flock on a file that names its holder: one process per batch, per search.

The kernel releases it when its holder dies, so a lock left by a killed process
never blocks anyone; the file keeps the holder's pid and host for the message
a second process gets.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dstui.core.errors import LockHeld


class HolderLock:
    """``acquire`` or raise ``LockHeld(busy(holder))``; ``release`` (also as a context manager)."""

    def __init__(self, path: Path, busy: Callable[[str], str]) -> None:
        self.path = path
        self.busy = busy
        self._fh: Any = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")  # noqa: SIM115 - held until release (or the holder's death)
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise LockHeld(self.busy(holder)) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {os.uname().nodename}\n")
        fh.flush()
        self._fh = fh

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None

    def __enter__(self) -> HolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
