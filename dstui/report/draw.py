"""The report's charts for one :class:`~dstui.report.context.ReportContext` (PNG files via :mod:`charts`)."""

from __future__ import annotations

from pathlib import Path

from dstui.analysis import speed
from dstui.analysis.grids import pareto
from dstui.analysis.stats import loss_band
from dstui.report import charts, charts_checks, charts_tuning, phases_chart
from dstui.report.context import ReportContext
from dstui.report.mdformat import marker


def draw(ctx: ReportContext, out: Path) -> None:
    labels = [c.label for c in ctx.train]
    markers = [marker(c) for c in ctx.train]
    bands = []
    for c in ctx.train:
        band = loss_band(c)
        if band is not None:
            bands.append((c.label, *band))
    if bands:
        # the difference panel: only conditions judged against the baseline itself (same numerics)
        same = [p.label for p in ctx.parity if p.compared_with == ctx.baseline]
        ctx.images["loss"] = charts.loss_curves(
            bands, out / "loss.png", baseline=ctx.baseline, comparable=same, tolerance=ctx.tolerance
        ).name
    if any(c.iter_time_mean is not None for c in ctx.train):
        s = ctx.scale
        ctx.images["iter_time"] = charts.hbars(
            labels,
            [c.iter_time_mean * s if c.iter_time_mean is not None else None for c in ctx.train],
            out / "iter_time.png",
            errors=[c.iter_time_std * s if c.iter_time_std is not None else None for c in ctx.train],
            markers=markers,
            highlight=ctx.baseline,
            xlabel=f"iteration time per optimizer step ({ctx.unit}); error bar: ±1 std",
            title="Mean iteration time after warm-up (lower is better; red: baseline)"
            if ctx.speed_basis == "time"
            else "Mean time per optimizer step after warm-up (red: baseline); tokens per step differ: "
            "compare speed in the throughput chart",
        ).name
    bars = (
        ("memory", [c.mem_peak_gb for c in ctx.train],
         "peak RSS of rank 0's process (GiB = 2^30 bytes)" if ctx.on_cpu
         else "peak memory (GiB = 2^30 bytes; GPU: CUDA max allocated, CPU: peak RSS)",
         "Peak RSS per rank, CPU (lower is better; red: baseline)" if ctx.on_cpu
         else "Peak memory per rank (lower is better; red: baseline)"),
        ("throughput", [c.tokens_per_s_mean for c in ctx.train], "throughput (tokens/s, all ranks)",
         "Training throughput after warm-up (higher is better; red: baseline)"),
        ("mfu", [c.mfu_mean * 100 if c.mfu_mean is not None else None for c in ctx.train],
         "model FLOPs utilisation (% of peak)", "MFU after warm-up (higher is better; red: baseline)"),
    )  # fmt: skip
    for key, values, xlabel, title in bars:
        if any(v is not None for v in values):
            ctx.images[key] = charts.hbars(
                labels, values, out / f"{key}.png", markers=markers, highlight=ctx.baseline, xlabel=xlabel, title=title
            ).name
    tokens = ctx.speed_basis == "tokens"
    pts = []
    for c in ctx.train:
        v = speed.value(c, ctx.speed_basis)
        if v is not None and c.mem_peak_gb is not None:
            pts.append((c.label, v if tokens else v * ctx.scale, c.mem_peak_gb))
    if len(pts) >= 2:
        front = [c.label for c in pareto(ctx.train, ctx.speed_basis)]
        ctx.images["tradeoff"] = charts.tradeoff(
            pts, front, out / "tradeoff.png", higher_is_faster=tokens,
            time_label="throughput (tokens/s, all ranks; higher is faster)" if tokens
            else f"iteration time ({ctx.unit}; lower is faster)",
            memory_label="peak RSS of rank 0's process (GiB)" if ctx.on_cpu else "peak memory (GiB)",
        ).name
    series = []
    warm = 0
    for c in ctx.train:
        repeats, outliers = [], []
        for r in c.runs:
            if r.usable and "iter_time" in r.history and len(r.history["iter_time"][0]):
                repeats.append(r.history["iter_time"])
                outliers += list(zip(r.stats.get("outlier_steps", []), r.stats.get("outlier_values", []), strict=False))
                warm = max(warm, r.stats.get("warmup_steps", 0))
        if repeats:
            series.append((c.label, repeats, outliers))
    if series:
        ctx.images["iter_series"] = charts.iter_time_series(
            series, out / "iter_time_per_step.png", unit=ctx.unit, scale=ctx.scale, warmup=warm
        ).name
    if ctx.times is not None and not ctx.times.empty:
        ctx.images["phases"] = phases_chart.phase_bars(ctx.times, out / "phases.png").name
    _draw_checks(ctx, out)
    _draw_tuning(ctx, out)


def _draw_checks(ctx: ReportContext, out: Path) -> None:
    """Revision ratios with their intervals; per-step differences of verify runs."""
    if ctx.revisions:
        rows = [
            (f"{c.condition} / {c.revision}", c.ratio, *(c.ratio_ci or (None, None)), c.ratio_note or "too few repeats")
            for c in ctx.revisions
            if c.ratio is not None
        ]
        if rows:
            ctx.images["revisions"] = charts_checks.ratio_intervals(rows, out / "revisions.png").name
    series = []
    for ch in ctx.checks:
        hist = {k: ch.run.history[k] for k in charts_checks.DIFF_KEYS if k in ch.run.history and len(ch.run.history[k][0])}
        if hist:
            series.append((ch.run.run_name, hist, ch.first_diverging_step))
    if series:
        atols = {ch.atol for ch in ctx.checks if ch.atol is not None}
        ctx.images["verify_steps"] = charts_checks.step_differences(
            series, out / "verify_steps.png", atol=atols.pop() if len(atols) == 1 else None
        ).name


def _draw_tuning(ctx: ReportContext, out: Path) -> None:
    """A `dstui tune` search's probes: predicted vs measured step time."""
    if ctx.tuning is not None:
        chart = charts_tuning.save_predicted_vs_measured(ctx.tuning, out / "tuning.png")
        if chart is not None:
            ctx.images["tuning"] = chart.name
