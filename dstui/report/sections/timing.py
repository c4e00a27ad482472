"""Report section "Where the time went": each run's wall time split into launch .. teardown.

Issue 12: a short verification batch spends most of its wall time outside
training steps. The supervisor logs each run's breakdown as ``time/*``
metrics (dstui.core.phases); this section shows them per run (table and the
stacked bar chart of :mod:`dstui.report.phases_chart`) and, per batch, the
*step share*: the sum of optimizer-step times over the batch's wall time.
Runs without a breakdown (imported seed logs, runs from before phase times
were recorded, runs that never reached their runner) are named, not drawn.
"""

from __future__ import annotations

import math

from dstui.analysis import phases
from dstui.core.phases import SEGMENTS, compile_cache_line
from dstui.report.context import ReportContext
from dstui.report.mdformat import code, codes, esc, img, table

EXPLAIN = (
    "launch: the supervisor starts the job until rank 0's process exists; imports: torch and DeepSpeed imported; "
    "init: process group, model, `deepspeed.initialize`, data; compile: the first step's excess over a typical "
    "step; steps: the rest of training; teardown: last step until the job's exit. Step share: the sum of the "
    "optimizer steps' own times over the wall time."
)


def _s(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f}"


def _pct(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.0%}"


def _compile_caches(ctx: ReportContext) -> list[str]:
    """How torch.compile's caches answered per compiled run (MLflow ``summary.compile_cache_*``).

    Beside the compile segment because it explains it: a repeat whose graphs
    still miss compiles again, whatever the cache folders hold.
    """
    names = phases.row_names(ctx.started)
    found = []
    for run in ctx.started:
        summary = {k.removeprefix("summary."): v for k, v in run.metrics.items() if k.startswith("summary.")}
        if line := compile_cache_line(summary):
            found.append(f"- {code(names[run.run_id])}: {esc(line)}")
    if not found:
        return []
    return ["", "torch.compile's caches, as the runs' processes found them (a graph that misses is compiled again):",
            "", *found]  # fmt: skip


def where_time_went(ctx: ReportContext) -> str:
    """The per-run table, the batches' step shares and the chart; a sentence when no run has phase times."""
    lines = ["## Where the time went", ""]
    frame = ctx.times
    missing = [r.run_name for r in ctx.started if not phases.has_breakdown(r)]  # never-started runs ran nothing
    if frame is None or frame.empty:
        lines.append(
            "No run of this report recorded phase times (imported logs, runs from before dstui recorded them, "
            "or runs that never reached their runner), so there is no time breakdown.\n"
        )
        return "\n".join(lines)
    for batch, (share, steps, wall) in sorted(ctx.step_shares.items()):
        lines.append(
            f"Step share of batch {code(batch or 'unnamed')}: **{share:.0%}**: {steps:.1f} s of optimizer steps in "
            f"{wall:.1f} s of wall time (first launch to last exit of its runs in the table below; runs that shared "
            "the box overlap in it)."
        )
    lines += ["", img(ctx, "phases", "where the wall time went"), EXPLAIN, ""]
    rows = [[name, *(_s(row[seg]) for seg in SEGMENTS), _s(row["wall"]), _pct(row["step_share"])]
            for name, row in frame.iterrows()]  # fmt: skip
    lines.append(table(["run", *(f"{seg} (s)" for seg in SEGMENTS), "wall (s)", "step share"], rows))
    lines += _compile_caches(ctx)
    if missing:
        lines += ["", "No time breakdown for " + codes(missing)
                  + " (imported, recorded before phase times existed, or never reached its runner): "
                  "their time is in none of the sums above."]  # fmt: skip
    return "\n".join(lines) + "\n"
