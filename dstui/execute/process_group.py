"""A local job's process group: is any of it alive, and stopping all of it.

Each local run is its own session (:mod:`dstui.execute.injob.wrap` leads it), so
its launcher and ranks are one process group that can be asked about and killed
at once, also by a process that did not start it (a supervisor that took over,
``dstui cancel``, the GPU ledger checking who still holds GPUs).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import psutil

KILL_GRACE_S = 5.0


def group_alive(pgid: int | None) -> bool:
    if not pgid:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie leader still "exists"; look for a live member
    for p in psutil.process_iter(["pid", "status"]):
        with contextlib.suppress(psutil.Error):
            if os.getpgid(p.info["pid"]) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                return True
    return False


def kill_group(pgid: int | None, grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM the run's whole process group, then SIGKILL what is left."""
    if not pgid:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.time() + grace_s
    while time.time() < deadline and group_alive(pgid):
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
