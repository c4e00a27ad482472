"""Who supervises a batch: the lock, starting a detached supervisor, cancelling a run.

These are what the CLI and the TUI call; they never follow runs themselves.
One supervisor per batch holds ``supervisor.lock`` (an flock, released by the
kernel when its holder dies), so anyone can tell whether a batch is looked after
and start a supervisor for it if not.
"""

from __future__ import annotations

import fcntl
import os
import time
from typing import Any

from dstui.core.errors import LockHeld
from dstui.core.rundir import ACTIVE_STATES, BatchDir, RunDir
from dstui.execute.executor import executor_for
from dstui.execute.wrap import start_supervisor


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


def spawn(batch: BatchDir, *, env: dict[str, str] | None = None, wait_s: float = 10.0) -> int:
    """Start a detached supervisor for a batch; returns its pid.

    Waits until it holds the batch lock (or has exited), so a caller that
    checks :func:`is_supervised` right after does not start a twin.
    """
    proc = start_supervisor(str(batch.path), env)
    deadline = time.time() + wait_s
    while time.time() < deadline and proc.poll() is None and not is_supervised(batch):
        time.sleep(0.05)
    return proc.pid


def kick(batch: BatchDir, *, settle_s: float = 3.0) -> None:
    """Make sure queued runs of a batch get a supervisor.

    A live supervisor picks up newly queued runs by itself; one that is just
    finishing may already have looked. So: if the lock is free, or becomes free
    within ``settle_s``, start a new supervisor.
    """
    deadline = time.time() + settle_s
    while is_supervised(batch):
        if time.time() > deadline:
            return  # a supervisor in its main loop: it will see the queued run
        time.sleep(0.1)
    spawn(batch)


def ensure_supervised(batch: BatchDir) -> bool:
    """Take over an unfinished batch whose supervisor died. True if one was started.

    A batch whose creation was cut short is settled first, so whoever looks at it
    next (the TUI's list) sees every run.
    """
    from dstui.execute import creation

    creation.settle(batch)
    if batch.is_finished() and batch.info().get("finalized"):
        return False
    if is_supervised(batch):
        return False
    spawn(batch)
    return True


def request_cancel(rd: RunDir) -> None:
    """Ask the supervisor to cancel a run; also kill at once if we can (the TUI's key)."""
    rd.cancel_file.write_text(str(time.time()))
    from dstui.execute import slurm

    if slurm.cancel_now(rd):  # a Slurm job: scancel; the supervisor settles it as cancelled
        return
    st = rd.status()
    if st.get("state") == "queued":
        if not is_supervised(rd.batch):  # else the supervisor sees the request before launching
            rd.update_status(state="killed", reason="cancelled before start", ended=time.time())
        return
    if st.get("state") in ACTIVE_STATES:
        executor_for(st).kill(st, grace_s=0.5)
