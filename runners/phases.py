"""Wall-clock marks of a runner's life, written as the ``phases`` record of metrics.jsonl.

Short verification runs spend most of their wall time outside training steps
(launcher, imports, process group, model, engine, compilation, teardown).
These marks (unix times, seconds) say where; dstui.core.phases turns them,
with the supervisor's launch and reap times, into the run's time breakdown.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

# The marks in the order a healthy run passes them (docs/ARCHITECTURE.md, "phases" record).
MARKS = (
    "process_start", "imports_done", "group_up", "model_built", "engine_ready",
    "first_step_done", "last_step_done", "exit",
)  # fmt: skip


def process_start_time() -> float:
    """When the kernel started this process (unix time), not when this module was imported.

    /proc/self/stat field 22 is the start in clock ticks after boot; /proc/uptime
    says how long ago boot was, to 10 ms (/proc/stat's btime is whole seconds:
    too coarse for a launch that takes a fraction of one). Elsewhere: now (the
    interpreter's start-up is then missed).
    """
    try:
        with open("/proc/self/stat") as fh:
            # the command name (field 2) may hold spaces: split after its closing parenthesis
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        now = time.time()
        return now - max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


class PhaseClock:
    """Collects the marks (a mark given again takes the new time).

    With :meth:`live_to`, rank 0 also writes each mark the moment it is reached
    (``phase.json`` beside the metrics file), so the supervisor can say what a
    run is doing while it does it, not only in the breakdown afterwards.
    """

    def __init__(self) -> None:
        self.marks: dict[str, float] = {"process_start": process_start_time()}
        self.live_file: str | None = None

    def live_to(self, metrics_file: str | None) -> None:
        """Write marks to ``phase.json`` next to ``metrics_file`` (rank 0 only; others pass None)."""
        if not metrics_file or os.environ.get("RANK", "0") != "0":
            return
        from dstui.core.rundir import PHASE_FILE

        self.live_file = os.path.join(os.path.dirname(os.path.abspath(metrics_file)), PHASE_FILE)
        last = next(reversed(self.marks))
        self._write(last, self.marks[last])

    def mark(self, name: str) -> None:
        if name not in MARKS:
            raise ValueError(f"unknown phase mark {name!r}; known: {', '.join(MARKS)}")
        self.marks[name] = time.time()
        self._write(name, self.marks[name])

    def _write(self, name: str, at: float) -> None:
        if not self.live_file:
            return
        tmp = f"{self.live_file}.{os.getpid()}.tmp"
        try:  # best effort: a full disk must not stop training
            # 0600 whatever the job's umask, like every file dstui keeps in a run folder
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as fh:
                json.dump({"mark": name, "time": at}, fh)
            os.replace(tmp, self.live_file)
        except OSError:
            pass

    def record(self) -> dict[str, Any]:
        """The fields of the ``phases`` record: every mark reached so far, in order."""
        return {name: self.marks[name] for name in MARKS if name in self.marks}
