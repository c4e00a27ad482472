"""Is a run still alive, stuck, or over; and when it is over, what became of it.

:func:`check` runs on every supervisor pass for a live run: it honours cancel
requests, kills a run that stopped writing, and once the job ended settles the
run's final state and reason (:func:`outcome`, a pure function of what the run
left behind, so each reason can be tested without a process).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Protocol

from dstui.core import failures, run_status, verdicts
from dstui.core.rundir import RunDir, read_json
from dstui.execute import guard_watch
from dstui.execute.ingest import Tracked

log = logging.getLogger("dstui.execute.supervisor")

DISK_FULL = "disk full (No space left on device)"  # the same words as failures' own for a log that says it

#: the automatic stall guard (``stall_after_s`` unset): after the first step, no new step for
#: max(STALL_FACTOR x the slowest step so far, STALL_FLOOR_S) stops the run
STALL_FACTOR = 10.0
STALL_FLOOR_S = 300.0


def stall_limit(settings: dict, st: dict) -> tuple[float, str] | None:
    """(seconds without a new step that count as stalled, how that was chosen), or None: not guarded.

    ``stall_after_s`` > 0 is a fixed limit (from the start); 0 turns the guard off; unset is the
    automatic guard, which starts at the first step (start-up and compilation are never judged)
    and scales with the run's own pace, so a slow model is not stopped for being slow.
    """
    fixed = settings.get("stall_after_s")
    if fixed is not None:
        return (float(fixed), "") if float(fixed) > 0 else None
    if not st.get("last_step_at"):
        return None
    slowest = float(st.get("slowest_step_s") or 0.0)
    return max(STALL_FACTOR * slowest, STALL_FLOOR_S), f" ({STALL_FACTOR:.0f}x the slowest step so far, at least {STALL_FLOOR_S:.0f} s)"


class ProcessJob(Protocol):
    """A job this host can see ending: its leader's end, any of its processes alive, stopping it, reaping it."""

    def ended(self, rd: RunDir, st: dict, handle: Any) -> bool: ...

    def alive(self, st: dict) -> bool: ...

    def cancel(self, st: dict, *, grace_s: float = ...) -> None: ...

    def reap(self, handle: Any) -> None: ...


def check(t: Tracked, st: dict, job: ProcessJob) -> None:
    """One look at a live run whose processes this host sees: cancel, hang, or end."""
    rd = t.rd
    if rd.cancel_file.exists() and job.alive(st):
        job.cancel(st)
    if not job.ended(rd, st, t.proc):
        if hung(rd, st):
            job.cancel(st)
        return
    # the job is over: wait for the group to drain (ranks may outlive the leader)
    if job.alive(st):
        job.cancel(st, grace_s=2.0)
    job.reap(t.proc)
    settle(rd, read_json(rd.exit_file) or wrapper_exit(t.proc))


def wrapper_exit(handle: Any) -> dict[str, Any]:
    """The wrapper's own exit status, when it could not write exit.json and we are its parent.

    The wrapper exits with the job's code (128 + N for a signal); without it the
    reason would be "exit status unknown".
    """
    code = getattr(handle, "returncode", None)
    if code is None:
        return {}
    return {"exit_code": code, "signal": -code if code < 0 else None, "from_wrapper": True}


def why_stuck(rd: RunDir, st: dict, settings: dict, now: float) -> tuple[str, str] | None:
    """(status flag, message) when a live run must be stopped: no output, no new step, too long."""
    started = st.get("started") or now
    hung_after = float(settings.get("hung_after_s", 600))
    last_output = max((m for p in (rd.log_file, rd.metrics_file) if (m := own_mtime(p)) is not None), default=started)
    if now - last_output > hung_after:
        return "hung", f"no output for {hung_after:.0f} s"
    stall = stall_limit(settings, st)
    if stall and now - (st.get("last_step_at") or started) > stall[0]:
        return "stalled", f"no new step for {stall[0]:.0f} s{stall[1]}"
    max_runtime = settings.get("max_runtime_s")
    if max_runtime and now - started > float(max_runtime):
        return "over_time", f"ran longer than max_runtime_s ({float(max_runtime):.0f} s)"
    return None


def own_mtime(path: os.PathLike[str]) -> float | None:
    """When a run's file last changed, by the name itself (lstat: a link the job put there is not followed)."""
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return None


def hung(rd: RunDir, st: dict) -> bool:
    """Stuck by any measure (no output, no new step, too long): marks the run; the caller kills its job."""
    stuck = why_stuck(rd, st, rd.settings(), time.time())
    if stuck is None:
        return False
    flag, message = stuck
    log.warning("%s: %s, killing it", rd.name, message)
    rd.update_status(**{flag: True, "stuck_message": message})
    return True


def settle(rd: RunDir, exit_info: dict) -> None:
    """Record how a finished job ended; clean up what its ranks could not."""
    st = rd.status()
    fields = outcome(
        st,
        exit_info,
        rd.settings(),
        cancelled=rd.cancel_file.exists(),
        log_tail=lambda: rd.log_tail(16384),
    )
    state, reason = fields.pop("state"), fields.pop("reason", None)
    run_status.ended(rd, state, reason, **fields)
    log.info("%s ended: %s %s", rd.name, state, reason or "")
    # killed or crashed ranks never unlink DeepSpeed's /dev/shm buffers: do it for them
    from dstui.core import shm

    removed = shm.remove_buffers(shm.master_port_of(st.get("argv")))
    if removed:
        log.info("%s: removed %d stale /dev/shm all-reduce buffers", rd.name, len(removed))


def outcome(st: dict, exit_info: dict, settings: dict, *, cancelled: bool, log_tail: Any) -> dict[str, Any]:
    """Final state and reason of a run from its status, exit record and log tail.

    ``log_tail`` is a callable, read only when the reason depends on it.
    """
    code = exit_info.get("exit_code")
    sig = exit_info.get("signal")
    summary = st.get("summary") or {}
    fields: dict[str, Any] = {"exit_code": code, "signal": sig}
    if cancelled:
        fields.update(state="killed", reason="cancelled")
    elif guard_watch.stopped_outcome(st):
        fields.update(guard_watch.stopped_outcome(st))
    elif st.get("hung"):
        hung_after = settings.get("hung_after_s")
        fields.update(state="failed", reason=f"hung (no output for {hung_after:.0f} s); process group killed")
    elif st.get("stalled"):
        message = st.get("stuck_message") or f"no new step for {float(settings.get('stall_after_s') or 0):.0f} s"
        fields.update(state="failed", reason=f"stalled ({message}); process group killed")
    elif st.get("over_time"):
        fields.update(state="failed", reason=f"ran past max_runtime_s ({settings.get('max_runtime_s'):.0f} s); process group killed")
    elif st.get("revision_mismatch"):
        fields.update(state="failed")
    elif code == 0 and not st.get("steps_done") and not summary:
        fmt = settings.get("metrics_format", "jsonl")
        expected = "metrics.jsonl records" if fmt == "jsonl" else "'Epoch .., Step .., Loss: ..' lines"
        fields.update(state="failed", reason=f"exited 0 but wrote no metrics (expected {expected})")
    elif code == 0:
        fields.update(state="done", reason=None)
    elif summary.get("verdict") == "FAIL":
        if summary.get("check"):
            fields.update(state="failed", reason=f"{summary['check']} FAIL")
        else:
            fields.update(state="failed", reason=verdicts.evidence(summary))
    elif exit_info.get("disk_full"):  # the wrapper saw the run folder's disk full when the job ended
        fields.update(state="failed", reason=DISK_FULL)
    else:
        fields.update(state="failed", reason=failures.classify(log_tail(), code, sig))
    return fields
