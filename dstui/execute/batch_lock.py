"""The batch lock: one supervisor per batch, and anyone can tell whether one lives.

``supervisor.lock`` is an flock, released by the kernel when its holder dies.
Laying out a batch (:mod:`~dstui.execute.creation`), re-laying it on resume
(:mod:`~dstui.execute.batch`) and supervising it (:mod:`~dstui.execute.supervisor`)
all hold it; :mod:`~dstui.execute.control` asks it before starting a supervisor.
"""

from __future__ import annotations

import fcntl
import os
from typing import Any

from dstui.core.errors import LockHeld
from dstui.core.rundir import BatchDir


class BatchLock:
    """flock on supervisor.lock: released by the kernel when the holder dies."""

    def __init__(self, batch: BatchDir) -> None:
        self.batch = batch
        self._fh: Any = None

    def acquire(self) -> None:
        self.batch.path.mkdir(parents=True, exist_ok=True)
        fh = open(self.batch.lock_file, "a+")  # noqa: SIM115 - held for the process lifetime
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise LockHeld(
                f"batch {self.batch.id} is already supervised by {holder}; "
                "use `dstui status` to watch it"
            ) from None
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


def is_supervised(batch: BatchDir) -> bool:
    """True when a live process holds the batch lock."""
    if not batch.lock_file.exists():
        return False
    with open(batch.lock_file, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False
