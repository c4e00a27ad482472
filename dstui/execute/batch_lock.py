"""The batch lock: one supervisor per batch, and anyone can tell whether one lives.

``supervisor.lock`` is an flock, released by the kernel when its holder dies.
Laying out a batch (:mod:`~dstui.execute.creation`), re-laying it on resume
(:mod:`~dstui.execute.batch`) and supervising it (:mod:`~dstui.execute.supervisor`)
all hold it; :mod:`~dstui.execute.control` asks it before starting a supervisor.
"""

from __future__ import annotations

import contextlib
import fcntl
import os

from dstui.core import proc_identity
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
    try:
        fd = os.open(batch.lock_file, os.O_RDWR)  # NFS emulates flock with byte-range locks: they need write access
    except FileNotFoundError:
        return False
    except OSError:  # a read-only home (`dstui status` still shows it): a local flock needs no write access
        fd = os.open(batch.lock_file, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def holder_pid(batch: BatchDir) -> int | None:
    """The pid holding the batch lock (the kernel's word, /proc/locks), None when free or unknown."""
    try:
        ino = os.stat(batch.lock_file).st_ino
        with open("/proc/locks") as fh:
            lines = fh.read(1 << 20).splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 12345 fd:01:1234567 0 EOF"; a waiter's line has "->" after the number
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[3] == "WRITE" and parts[5].rsplit(":", 1)[-1] == str(ino):
            with contextlib.suppress(ValueError):
                return int(parts[4])
    return None


def stopped_note(batch: BatchDir) -> str | None:
    """A line for `dstui status` when the batch's supervisor is alive but stopped (SIGSTOP, a debugger):
    it holds the lock, so nobody takes over, and nothing of the batch moves (runs are not
    started, followed or sent to MLflow). None otherwise."""
    if not is_supervised(batch):
        return None
    pid = holder_pid(batch)
    if pid is None or proc_identity.state_of(pid) not in ("T", "t"):
        return None
    return (f"the supervisor (pid {pid}) is stopped: no run starts and nothing reaches MLflow "
            f"until it goes on (`kill -CONT {pid}`)")  # fmt: skip
