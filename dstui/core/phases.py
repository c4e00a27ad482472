"""A run's time breakdown: where the wall time between launch and reap went.

Inputs are the run folder's own files: the runner's ``phases`` record
(metrics.jsonl; runners/phases.py), its summary (``compile_time``,
``step_time_sum``), the supervisor's launch time (status.json ``started``)
and the exit time the wrapper recorded (exit.json ``ended``, else status.json
``ended``). The segments are consecutive and add up to the wall time, so a
stacked bar of them is the whole run:

======== ===========================================================================
launch   supervisor starts the job -> rank 0's process exists (launcher, its imports)
imports  rank 0's interpreter start -> torch/deepspeed imported
init     -> process group up, model built, engine initialized, data ready
compile  the first step's excess over a typical step (compilation, autotuning)
steps    the remaining time until the last step is done
teardown last step done -> the job's exit seen by its wrapper
======== ===========================================================================

Core stage: stdlib only, used by the supervisor (MLflow ``time/*`` metrics),
``dstui status`` and dstui.analysis.phases (reports, TUI).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from dstui.core.record_file import read_records
from dstui.core.records import PHASES, SUMMARY
from dstui.core.rundir import FINAL_STATES, RunDir, read_json

SEGMENTS = ("launch", "imports", "init", "compile", "steps", "teardown")


@dataclass(frozen=True)
class Breakdown:
    """Seconds per segment (each None where a mark is missing) plus the totals they explain."""

    launch: float | None
    imports: float | None
    init: float | None
    compile: float | None
    steps: float | None
    teardown: float | None
    wall: float | None
    step_time_sum: float | None

    @property
    def step_share(self) -> float | None:
        """Sum of the optimizer steps' own times / the run's wall time: how much of it trained."""
        if self.step_time_sum is None or not self.wall:
            return None
        return self.step_time_sum / self.wall

    def as_dict(self) -> dict[str, float | None]:
        return {**asdict(self), "step_share": self.step_share}

    def line(self) -> str:
        """One line for `dstui status`: '12.3 s: launch 4.1, ... (optimizer steps 8% of wall, compile included)'."""
        parts = [f"{k} {getattr(self, k):.1f}" for k in SEGMENTS if getattr(self, k) is not None]
        head = f"{self.wall:.1f} s: " if self.wall is not None else ""
        # the share counts every optimizer step whole, the first one's compile too: not the 'steps' segment
        share = f" (optimizer steps {self.step_share:.0%} of wall, compile included)" if self.step_share is not None else ""
        return head + ", ".join(parts) + share


#: torch.compile's caches a runner counts (runners/common.compile_cache_counts), by name in its summary
COMPILE_CACHES = {"fxgraph": "Inductor graphs", "autograd": "AOTAutograd"}
CACHE_OUTCOMES = ("hit", "miss", "bypass")


def compile_cache_key(cache: str, outcome: str) -> str:
    """The summary key of one cache's count of one outcome: ``compile_cache_fxgraph_hit``."""
    return f"compile_cache_{cache}_{outcome}"


def compile_cache_line(summary: dict[str, Any] | None) -> str | None:
    """'Inductor graphs 2 hit, 1 miss; AOTAutograd 3 miss' from a summary's compile_cache_* counts, if any."""
    summary = summary or {}
    parts = []
    for key, label in COMPILE_CACHES.items():
        counts = []
        for outcome in CACHE_OUTCOMES:
            value = summary.get(compile_cache_key(key, outcome))
            if isinstance(value, (int, float)) and value:
                counts.append(f"{int(value)} {outcome}")
        if counts:
            parts.append(f"{label} " + ", ".join(counts))
    return "; ".join(parts) or None


def _gap(later: float | None, earlier: float | None) -> float | None:
    return None if later is None or earlier is None else max(0.0, later - earlier)


def breakdown(
    marks: dict[str, float],
    *,
    launched: float | None,
    reaped: float | None,
    summary: dict[str, Any] | None = None,
) -> Breakdown:
    """The segments from the runner's marks, the launch/reap times and the run's summary."""
    summary = summary or {}
    engine = marks.get("engine_ready")
    last = marks.get("last_step_done")
    compile_s = summary.get("compile_time")
    run_steps = _gap(last, engine)
    if run_steps is not None and isinstance(compile_s, (int, float)):
        compile_s = min(float(compile_s), run_steps)
        run_steps -= compile_s
    else:
        compile_s = None
    step_sum = summary.get("step_time_sum")
    return Breakdown(
        launch=_gap(marks.get("process_start"), launched),
        imports=_gap(marks.get("imports_done"), marks.get("process_start")),
        init=_gap(engine, marks.get("imports_done")),
        compile=compile_s,
        steps=run_steps,
        teardown=_gap(reaped, last),
        wall=_gap(reaped, launched),
        step_time_sum=float(step_sum) if isinstance(step_sum, (int, float)) else None,
    )


def of_run(rd: RunDir) -> Breakdown | None:
    """The breakdown of a run from its folder; None before its runner wrote a ``phases`` record."""
    if not rd.metrics_file.exists():
        return None
    marks: dict[str, float] = {}
    summary: dict[str, Any] = {}
    for rec in read_records(rd.metrics_file):
        if rec.get("type") == PHASES:
            marks = {k: v for k, v in rec.items() if isinstance(v, (int, float)) and k != "time"}
        elif rec.get("type") == SUMMARY:
            summary.update(rec)
    if not marks:
        return None
    st = rd.status()
    exit_info = read_json(rd.exit_file, {}) or {}
    reaped = exit_info.get("ended") or st.get("ended")
    return breakdown(marks, launched=st.get("started"), reaped=reaped, summary=summary)


def from_status(st: dict[str, Any]) -> Breakdown | None:
    """The breakdown the supervisor stored in a run's status.json (``phases``), if any."""
    stored = st.get("phases")
    if not isinstance(stored, dict):
        return None
    return Breakdown(**{k: stored.get(k) for k in Breakdown.__dataclass_fields__})


def batch_step_share(statuses: list[dict[str, Any]]) -> tuple[float, float, float] | None:
    """(share, sum of step times, wall) of a batch: its runs' step time over first launch -> last exit.

    Runs that share the box on disjoint GPUs overlap in time, so the share of
    a parallel batch can exceed what any one run reaches.
    """
    finished = []  # runs still going (or never started) are left out of both sums
    for st in statuses:
        start, end, b = st.get("started"), st.get("ended"), from_status(st)
        if not isinstance(start, (int, float)) or not isinstance(end, (int, float)):
            continue
        if b is not None and b.wall:
            end = start + b.wall  # the wrapper saw the exit; the supervisor noticed it later
        finished.append((start, end, b))
    starts = [s for s, _, _ in finished]
    ends = [e for _, e, _ in finished]
    sums = [b.step_time_sum for _, _, b in finished if b and b.step_time_sum]
    if not sums or max(ends) <= min(starts):
        return None
    wall = max(ends) - min(starts)
    return sum(sums) / wall, sum(sums), wall


def record(rd: RunDir) -> dict[str, Any]:
    """Store the run's breakdown in its status.json (``phases``); return the status."""
    times = of_run(rd)
    if times is None:
        return rd.status()
    return rd.update_status(phases=times.as_dict())


def live_text(st: dict[str, Any], now: float | None = None, width: int | None = None) -> str:
    """'building op shm 12s' for a live run with a phase (status.json's ``phase``, ``phase_since``:
    dstui/execute/live_phase.py keeps them); '' otherwise. ``width``: the phase's words are cut to
    fit (with '…'), its seconds are always kept."""
    phase = str(st.get("phase") or "")
    if not phase or st.get("state") in FINAL_STATES:
        return ""
    if width is not None and len(phase) > width - 5:
        phase = phase[: max(1, width - 6)] + "…"
    since = st.get("phase_since")
    if not isinstance(since, (int, float)):
        return str(phase)
    secs = max(0.0, (now or time.time()) - since)
    return f"{phase} {secs:.0f}s" if secs < 600 else f"{phase} {secs / 60:.0f}m"
