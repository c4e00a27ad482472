"""Timings taken beside other runs (tag dstui.overlapped) are flagged and left out of speed, unless asked (issue 38.2).

The issue's numbers: z0 timed while another batch shared 2 cores read 221 ± 188 ms/step against 26
for z1. Runs in memory, the report's own :func:`~dstui.analysis.results.compute` and sections.
"""

from __future__ import annotations

import numpy as np

from dstui.analysis.results import Results, compute
from dstui.analysis.rundata import RunData
from dstui.analysis.stats import compute_run_stats
from dstui.report.context import ReportContext
from dstui.report.sections import overview, quality

BESIDE = "steps 1-8 beside batch lrsweep-20261127-101010 (runs z1-lr1e-4-r0, z2-lr1e-4-r0); host load 3.9 mean"


def timed_run(condition: str, repeat: int, mean_s: float, *, overlapped: bool = False, include: bool = False) -> RunData:
    steps = np.arange(1, 9)
    times = mean_s * (1 + 0.001 * np.sin(steps + repeat))
    tags = {"dstui.batch": "b1"}
    if overlapped:
        tags |= {"dstui.overlapped": "true", "dstui.overlap": BESIDE}
    r = RunData(run_id=f"{condition}-{repeat}", run_name=f"{condition}-r{repeat}", experiment_id="1",
                condition=condition, revision="installed", repeat=repeat, kind="train", status="done", reason="",
                mlflow_status="FINISHED", start_time=repeat, params={"warmup_steps": "0", "zero_stage": condition[1:]},
                tags=tags, metrics={}, history={"iter_time": (steps, times), "loss": (steps, 5.0 - 0.1 * steps),
                                                "mem_peak": (steps, np.full(8, 2.0**30))})  # fmt: skip
    r.stats = compute_run_stats(r, include_overlapped=include)
    return r


def runs(include: bool) -> list[RunData]:
    """z0: two clean repeats at 26 ms and one at 221 ms beside another batch; z1: three clean at 26 ms."""
    return [timed_run("z0", 0, 0.026, include=include), timed_run("z0", 1, 0.026, include=include),
            timed_run("z0", 2, 0.221, overlapped=True, include=include),
            *(timed_run("z1", i, 0.026, include=include) for i in range(3))]  # fmt: skip


def context(res: Results) -> ReportContext:
    return ReportContext.of(res)


def test_an_overlapped_run_feeds_no_speed_figure_but_keeps_its_loss_and_memory() -> None:
    res = compute(runs(include=False))
    z0 = res.condition("z0")
    assert z0 is not None and z0.n_overlapped == 1 and z0.n_timings_left_out == 1
    assert abs(z0.iter_time_mean - 0.026) < 0.001  # the two clean repeats only
    ratio = res.speed_ratios["z1"]
    assert (ratio.n, ratio.n_base) == (3, 2) and abs(ratio.ratio - 1.0) < 0.01  # the same work: the same speed
    gone = z0.runs[2].stats
    assert "iter_time_mean" not in gone and abs(gone["overlapped_timings"]["iter_time_mean"] - 0.221) < 0.001
    assert gone["final_loss"] == 4.2 and gone["mem_peak_max"] == 2.0**30  # its loss and memory still count
    text = quality.quality(context(res))
    assert "1 timed beside other runs (timings left out)" in text
    assert "1 run(s) were timed while other runs shared this machine" in text and "**left out**" in text
    assert "| z0-r2 | `" + BESIDE + "` | 221.0 | left out |" in text, text
    assert any("left out of speed comparisons" in line for line in overview.headlines(context(res)))


def test_include_overlapped_counts_them_and_says_so() -> None:
    res = compute(runs(include=True))
    z0 = res.condition("z0")
    assert z0 is not None and z0.n_overlapped == 1 and z0.n_timings_left_out == 0
    assert z0.iter_time_mean > 0.09  # 221 ms pulls the pooled mean up: what the report showed
    assert res.speed_ratios["z1"].n_base == 3
    ctx = context(res)
    ctx.include_overlapped = True
    text = quality.quality(ctx)
    assert "**included**" in text and "| z0-r2 | `" + BESIDE + "` | 221.0 | kept |" in text, text
