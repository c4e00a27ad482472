"""The batch lock: one supervisor per batch, and anyone can tell whether one lives.

``supervisor.lock`` is an flock, released by the kernel when its holder dies.
Laying out a batch (:mod:`~dstui.execute.creation`), re-laying it on resume
(:mod:`~dstui.execute.batch`) and supervising it (:mod:`~dstui.execute.supervisor`)
all hold it; :mod:`~dstui.execute.control` asks it before starting a supervisor.
"""

from __future__ import annotations

import fcntl

from dstui.core.holder_lock import HolderLock
from dstui.core.rundir import BatchDir


class BatchLock(HolderLock):
    """flock on supervisor.lock: released by the kernel when the holder dies."""

    def __init__(self, batch: BatchDir) -> None:
        super().__init__(batch.lock_file, lambda holder: f"batch {batch.id} is already supervised by {holder}; "
                                                          "use `dstui status` to watch it")  # fmt: skip
        self.batch = batch


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
