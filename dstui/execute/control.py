"""Who supervises a batch: starting a detached supervisor, cancelling a run.

One supervisor per batch holds ``supervisor.lock`` (:mod:`~dstui.execute.batch_lock`),
so anyone can tell whether a batch is looked after. Whether and when to start another
is one rule for every face: :mod:`dstui.usecases.takeover` (the only caller of
:func:`spawn` besides the launch).
"""

from __future__ import annotations

import logging
import time

from dstui.core import run_status
from dstui.core.errors import DstuiError
from dstui.core.rundir import BatchDir, RunDir
from dstui.execute import backends
from dstui.execute.batch_lock import is_supervised
from dstui.execute.injob.standby import start_supervisor

log = logging.getLogger("dstui.execute.control")


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


def request_cancel(rd: RunDir) -> None:
    """Ask the supervisor to cancel a run; also stop its job at once if it has one (the TUI's key).

    A run whose job exists (a process group here, a Slurm job pending or running)
    is stopped through its backend now; the supervisor settles it as cancelled.
    """
    rd.cancel_file.write_text(str(time.time()))
    st = rd.status()
    backend = backends.for_run(rd, st)
    if backend.live(st):
        try:
            backend.cancel(st, grace_s=0.5)
        except DstuiError as e:  # the scheduler did not answer: the supervisor sees the request and tries again
            log.warning("%s: %s", rd.name, e)
        return
    if st.get("state") == "queued" and not is_supervised(rd.batch):  # else the supervisor sees it before launching
        run_status.cancelled_before_start(rd)
