"""What a live run is doing right now, and since when: its phase, for every view.

A run used to sit at ``running 0/8, loss -`` for half a minute while DeepSpeed
JIT-built an op, and the phase was named only afterwards (``init 29.6``). Now
the supervisor keeps ``phase`` and ``phase_since`` in status.json while the run
lives, from three sources:

- its own decisions: ``waiting for GPUs held by ...``, ``building op X`` (the
  prebuild before the first run), ``launching``;
- the bundled runner's marks as they happen (``phase.json``, written by rank 0 at
  each mark of runners/phases.py): importing, starting the process group,
  building the model, initializing DeepSpeed, the first step (compiling);
- the job's processes: a JIT op build runs ninja in the op's folder (torch's
  cpp_extension, which DeepSpeed's op builders use, silently by default), so an
  op built inside the run is named while it builds, whatever program runs.

``dstui status``, ``dstui run``, the runs table and the live legend show
:func:`dstui.core.phases.live_text` (``building op shm 12s``).
"""

from __future__ import annotations

import os
import time
from typing import Any

from dstui.core.rundir import FINAL_STATES, PHASE_FILE, RunDir, read_json

# runner mark -> the phase that begins there (runners/phases.py MARKS)
AFTER_MARK = {
    "process_start": "importing",
    "imports_done": "starting process group",
    "group_up": "building model",
    "model_built": "initializing DeepSpeed",
    "engine_ready": "first step",
    "first_step_done": "training",
    "last_step_done": "finishing",
    "exit": "finishing",
}

# processes that mean "an op is being JIT-built" (torch's cpp_extension drives ninja, which runs the compilers)
BUILDERS = ("ninja", "nvcc", "cc1plus", "c++", "g++", "ccache")


def set_phase(rd: RunDir, phase: str | None, since: float | None = None) -> None:
    """Write the phase into status.json, keeping its start time while it stays the same."""
    st = rd.status()
    if st.get("phase") == phase:
        return
    rd.update_status(phase=phase, phase_since=since if since is not None else time.time())


class LivePhases:
    """The supervisor's view of what each live run does now (one per batch, in its follower)."""

    def update(self, rd: RunDir, settings: dict[str, Any] | None = None) -> str | None:
        """Move the run's phase forward from its runner's mark and its processes; the phase."""
        st = rd.status()
        state = st.get("state")
        if state in FINAL_STATES:
            if st.get("phase"):
                rd.update_status(phase=None, phase_since=None)
            return None
        if state not in ("starting", "running"):
            return st.get("phase")
        mark = read_json(rd.path / PHASE_FILE, {}) or {}
        phase, since = "launching", _num(st.get("started") or st.get("starting"))
        if isinstance(mark, dict) and mark.get("mark") in AFTER_MARK:
            phase, since = AFTER_MARK[mark["mark"]], _num(mark.get("time"))
            settings = settings if settings is not None else rd.settings()
            if phase == "first step" and (settings.get("compile") or settings.get("deepcompile")):
                phase = "first step (compiling)"
        if st.get("steps_done") and phase not in ("finishing",):
            phase, since = "training", _num(st.get("started"))  # the step column counts from here
        elif phase != "training":
            build = op_build(st.get("pid"))
            if build is not None:
                phase, since = f"building op {build[0]}", build[1]
        set_phase(rd, phase, since)
        return phase


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) else None


def op_build(pid: Any) -> tuple[str, float] | None:
    """(op name, since) when a JIT build runs in the job's process tree: ninja's folder is the op's."""
    if not isinstance(pid, int) or pid <= 0:
        return None
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return None
    found: tuple[str, float] | None = None
    for c in children:
        try:
            if c.name() not in BUILDERS:
                continue
            name, since = os.path.basename(c.cwd()) or c.name(), c.create_time()
        except psutil.Error:
            continue
        if found is None or since < found[1]:  # the oldest builder: ninja, in the op's folder
            found = (name, since)
    return found
