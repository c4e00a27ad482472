"""PNG charts for reports (matplotlib, Agg backend, imported on first use).

Each function takes numbers computed in :mod:`dstui.analysis.stats` and writes one
file. Choices made so that charts stay legible with many conditions and long
labels: horizontal bars (labels read left to right, never rotated), value
labels at the bar ends, legends outside the plotting area, units in every axis
title, and figure height that grows with the number of conditions. Long
histories are decimated before drawing: a 10,000-step curve on a 1,000-pixel
wide chart shows nothing more than 2,000 points do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dstui.core.formatting import fmt_sig

MAX_POINTS = 2000
MAX_LABEL = 48


def agg_pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path) -> Path:
    """Write the figure as PNG and free it (every chart ends here)."""
    fig.savefig(path, dpi=110, bbox_inches="tight")
    agg_pyplot().close(fig)
    return path


def from_zero(ax: Any, axis: str, top: float | None = None, headroom: float = 1.08) -> None:
    """A value axis that starts at zero, so a bar or point's distance from the edge is its size.

    Why: autoscaled limits of 0.5215-0.5230 GiB make a 1 MiB difference fill
    the plot, and margins around small times put the axis start at -25 ms.
    """
    lo, hi = ax.get_xlim() if axis == "x" else ax.get_ylim()
    hi = max(hi, top if top is not None else hi) * headroom if hi > 0 else 1.0
    (ax.set_xlim if axis == "x" else ax.set_ylim)(0.0, hi)


def log_span(ax: Any, values: Any, decades: float = 1.0) -> None:
    """A log y-axis that spans at least ``decades`` decades around the data's geometric middle.

    Why: a log axis autoscaled to 9.5-9.6 ms makes 1% of noise fill the plot;
    one decade keeps a 10% change the size it is.
    """
    import numpy as np

    v = np.asarray([x for x in values if x is not None and np.isfinite(x) and x > 0], dtype=float)
    if not len(v):
        return
    lo, hi = float(v.min()), float(v.max())
    need = 10.0**decades
    if hi / lo < need:
        mid = math.sqrt(lo * hi)
        lo, hi = mid / math.sqrt(need), mid * math.sqrt(need)
    cur_lo, cur_hi = ax.get_ylim()
    ax.set_ylim(min(lo / 1.15, cur_lo) if cur_lo > 0 else lo / 1.15, max(hi * 1.15, cur_hi))


def short_label(text: str, limit: int = MAX_LABEL) -> str:
    """Labels longer than ``limit`` keep their start and end (where names differ)."""
    if len(text) <= limit:
        return text
    keep = (limit - 1) // 2
    return text[:keep] + "…" + text[-(limit - 1 - keep) :]


def _decimate(x: Any, *ys: Any) -> tuple[Any, ...]:
    import numpy as np

    n = len(x)
    if n <= MAX_POINTS:
        return (x, *ys)
    idx = np.unique(np.linspace(0, n - 1, MAX_POINTS).astype(int))
    return (x[idx], *(y[idx] for y in ys))


def time_unit(values: Sequence[float]) -> tuple[str, float]:
    """('ms', 1000) when every value is below a second, else ('s', 1)."""
    finite = [v for v in values if v is not None]
    if finite and max(finite) < 1.0:
        return "ms", 1000.0
    return "s", 1.0


fmt_num = fmt_sig  # the charts' and report's short number format (dstui.core.formatting)


def loss_curves(
    series: Sequence[tuple[str, Any, Any, Any, Any]],
    path: Path,
    *,
    baseline: str | None = None,
    title: str = "Training loss",
    comparable: Sequence[str] | None = None,
    tolerance: float | None = None,
) -> Path:
    """One line per condition (mean over repeats) with a shaded min-max band; see :func:`loss_figure`."""
    return save(loss_figure(series, baseline=baseline, title=title, comparable=comparable, tolerance=tolerance), path)


def loss_figure(
    series: Sequence[tuple[str, Any, Any, Any, Any]],
    *,
    baseline: str | None = None,
    title: str = "Training loss",
    comparable: Sequence[str] | None = None,
    tolerance: float | None = None,
) -> Any:
    """The loss chart as a matplotlib Figure.

    ``series``: (label, steps, mean, min, max). With a ``baseline`` a second
    panel shows each condition's mean loss minus the baseline's on common
    steps: parity differences of 1e-4 are invisible on a loss axis spanning 2.
    Only conditions in ``comparable`` (those whose numerics should match the
    baseline's; all when None) are drawn there: a micro-batch change differs
    by design. The panel's y-range covers at least ±``tolerance``, shaded, so
    a difference well inside it never fills the panel and looks like a
    divergence. The legend sits below the axes so it never hides a curve.
    """
    import numpy as np

    plt = agg_pyplot()
    base = next((s for s in series if s[0] == baseline), None) if baseline else None
    diffed = [s for s in series if s[0] != baseline and (comparable is None or s[0] in comparable)]
    with_diff = base is not None and bool(diffed)
    if with_diff:
        fig, (ax, dx) = plt.subplots(
            2, 1, figsize=(10, 7.5), sharex=True, gridspec_kw={"height_ratios": [3, 1.6]}
        )
    else:
        fig, ax = plt.subplots(figsize=(10, 5.5))
        dx = None
    cmap = plt.get_cmap("tab10" if len(series) <= 10 else "tab20")
    for i, (label, steps, mean, lo, hi) in enumerate(series):
        color = cmap(i % cmap.N)
        x, m, a, b = _decimate(steps, mean, lo, hi)
        style = "-" if i < 10 else "--"
        ax.plot(x, m, style, color=color, lw=1.6, label=short_label(label))
        if (b - a).any():
            ax.fill_between(x, a, b, color=color, alpha=0.18, lw=0)
        if dx is not None and base is not None and any(d[0] == label for d in diffed):
            common, ia, ib = np.intersect1d(steps, base[1], return_indices=True)
            if len(common):
                cx, cd = _decimate(common, mean[ia] - base[2][ib])
                dx.plot(cx, cd, style, color=color, lw=1.2)
    ax.set_ylabel("loss")
    ax.set_title(title + " (line: mean of repeats; band: min-max)")
    ax.grid(True, alpha=0.3)
    bottom = ax
    if dx is not None:
        dx.axhline(0.0, color="#333333", lw=0.8)
        if tolerance is not None and math.isfinite(tolerance) and tolerance > 0:
            dx.axhspan(-tolerance, tolerance, color="#2ca02c", alpha=0.12, lw=0, label=f"tolerance ±{tolerance:g}")
            lo, hi = dx.get_ylim()
            dx.set_ylim(min(lo, -1.25 * tolerance), max(hi, 1.25 * tolerance))
        who = "" if comparable is None or len(diffed) == len(series) - 1 else " (same numerics only)"
        dx.set_ylabel(f"loss - {short_label(str(baseline), 20)}{who}", fontsize=9)
        dx.grid(True, alpha=0.3)
        bottom = dx
    bottom.set_xlabel("optimizer step")
    ncol = 1 if len(series) <= 3 else 2 if len(series) <= 8 else 3
    handles, labels = ax.get_legend_handles_labels()
    if dx is not None:
        h2, l2 = dx.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    bottom.legend(
        handles,
        labels,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.3 if dx is not None else -0.14),
        ncol=ncol,
        fontsize=9,
        frameon=False,
    )
    fig.tight_layout()
    return fig


def hbars(
    labels: Sequence[str],
    values: Sequence[float | None],
    path: Path,
    *,
    xlabel: str,
    title: str,
    errors: Sequence[float | None] | None = None,
    markers: Sequence[str] | None = None,
    highlight: str | None = None,
    value_fmt: Any = fmt_num,
) -> Path:
    """Horizontal bars with value labels; conditions without a value show a marker text.

    ``markers`` (e.g. 'OOM', 'failed') are printed in place of a bar so a
    failed condition stays visible instead of silently missing. The value axis
    starts at zero (a bar is a length).
    """
    return save(hbars_figure(labels, values, xlabel=xlabel, title=title, errors=errors, markers=markers,
                             highlight=highlight, value_fmt=value_fmt), path)  # fmt: skip


def hbars_figure(
    labels: Sequence[str],
    values: Sequence[float | None],
    *,
    xlabel: str,
    title: str,
    errors: Sequence[float | None] | None = None,
    markers: Sequence[str] | None = None,
    highlight: str | None = None,
    value_fmt: Any = fmt_num,
) -> Any:
    """The horizontal bar chart as a matplotlib Figure (see :func:`hbars`)."""
    plt = agg_pyplot()
    n = len(labels)
    fig, ax = plt.subplots(figsize=(10, max(2.2, 0.45 * n + 1.3)))
    ys = list(range(n))[::-1]
    vals = [v if v is not None else 0.0 for v in values]
    errs = [e if e is not None else 0.0 for e in errors] if errors else None
    colors = ["#d62728" if highlight and lab == highlight else "#4c72b0" for lab in labels]
    ax.barh(
        ys,
        vals,
        xerr=errs,
        color=colors,
        alpha=0.85,
        capsize=4 if errs else 0,
        error_kw={"elinewidth": 1.2, "ecolor": "#333333"},
    )
    top = max([v + (errs[i] if errs else 0.0) for i, v in enumerate(vals)] + [0.0])
    span = top if top > 0 else 1.0
    for i, (y, v) in enumerate(zip(ys, values, strict=True)):
        if v is None:
            text = markers[i] if markers and markers[i] else "no data"
            ax.text(span * 0.01, y, text, va="center", ha="left", fontsize=9, color="#d62728", fontweight="bold")
            continue
        end = v + (errs[i] if errs else 0.0)
        label = value_fmt(v)
        if errs and errors and errors[i]:
            label += f" ± {value_fmt(errors[i])}"
        ax.text(end + span * 0.01, y, label, va="center", ha="left", fontsize=9)
    ax.set_yticks(ys)
    ax.set_yticklabels([short_label(lab) for lab in labels], fontsize=9)
    ax.set_xlim(0, span * 1.28)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def tradeoff(
    points: Sequence[tuple[str, float, float]],
    front: Sequence[str],
    path: Path,
    *,
    time_label: str,
    higher_is_faster: bool = False,
    memory_label: str = "peak memory (GiB)",
) -> Path:
    """Speed vs peak memory; the Pareto-optimal conditions are joined by a line (see :func:`tradeoff_figure`)."""
    return save(tradeoff_figure(points, front, time_label=time_label, higher_is_faster=higher_is_faster,
                                memory_label=memory_label), path)  # fmt: skip


FRONT_COLOR = "#2ca02c"  # not the baseline's red: on this chart a colour must mean one thing only


def coinciding(points: Sequence[tuple[str, float, float]], xspan: float, yspan: float,
               near: float = 0.02) -> list[list[tuple[str, float, float]]]:  # fmt: skip
    """Points grouped where their markers would overlap (within ``near`` of each axis's span), in order.

    Two conditions with the same speed and memory drawn one over the other
    show one marker and labels printed through each other ("z21" for z1 and
    z2); a group gets one marker position and one label naming all of them.
    """
    groups: list[list[tuple[str, float, float]]] = []
    for p in points:
        for g in groups:
            if abs(g[0][1] - p[1]) <= near * xspan and abs(g[0][2] - p[2]) <= near * yspan:
                g.append(p)
                break
        else:
            groups.append([p])
    return groups


def tradeoff_figure(
    points: Sequence[tuple[str, float, float]],
    front: Sequence[str],
    *,
    time_label: str,
    higher_is_faster: bool = False,
    memory_label: str = "peak memory (GiB)",
) -> Any:
    """Speed (iteration time, or tokens/s with ``higher_is_faster``) vs peak memory, both axes from zero.

    From zero: conditions 1 MiB apart at 0.52 GiB sit together, as they are,
    instead of at opposite corners; a time axis never starts below zero.
    Conditions whose markers coincide share one label ("z1, z2").
    """
    plt = agg_pyplot()
    fig, ax = plt.subplots(figsize=(9, 5.5))
    xspan = max((p[1] for p in points), default=1.0) * 1.3 or 1.0
    yspan = max((p[2] for p in points), default=1.0) * 1.15 or 1.0
    better = "faster" if not higher_is_faster else "faster (more tokens/s)"
    labelled: set[bool] = set()
    for group in coinciding(points, xspan, yspan):
        on = any(label in front for label, _, _ in group)
        _, t, mem = group[0]
        legend = None if on in labelled else (f"no other condition is both {better} and smaller" if on else "other conditions")
        labelled.add(on)
        ax.scatter([t], [mem], s=60 if on else 35, color=FRONT_COLOR if on else "#4c72b0", zorder=3, label=legend)
        name = ", ".join(short_label(label, 32 if len(group) == 1 else 16) for label, _, _ in group[:4])
        name += f" (+{len(group) - 4})" if len(group) > 4 else ""
        ax.annotate(name, (t, mem), textcoords="offset points", xytext=(6, 4), fontsize=8)
    fr = sorted([p for p in points if p[0] in front], key=lambda p: p[1])
    if len(fr) > 1:
        ax.plot([p[1] for p in fr], [p[2] for p in fr], "-", color=FRONT_COLOR, alpha=0.5, zorder=2)
    ax.set_xlabel(time_label)
    ax.set_ylabel(memory_label)
    ax.set_title("Speed / memory trade-off", fontsize=10)
    if points:
        ax.legend(loc="lower right", fontsize=8)
    ax.grid(True, alpha=0.3)
    from_zero(ax, "x", max(p[1] for p in points) * 1.3 if points else None)
    from_zero(ax, "y", max(p[2] for p in points) if points else None, headroom=1.15)
    fig.tight_layout()
    return fig


def iter_time_series(
    series: Sequence[tuple[str, Sequence[tuple[Any, Any]], Sequence[tuple[Any, Any]]]],
    path: Path,
    *,
    unit: str,
    scale: float,
    warmup: int,
) -> Path:
    """Per-step iteration time of every usable repeat (one colour per condition).

    ``series``: (label, [(steps, values) per repeat], [(step, value) outliers]).
    Warm-up is shaded and outliers are crossed, so the reader sees what the
    statistics left out and what they kept. Log scale: a 20 s compile step
    and 0.2 s steady steps both stay readable; the axis spans at least a
    decade, so noise of a few percent stays small (:func:`log_span`).
    """
    return save(iter_time_figure(series, unit=unit, scale=scale, warmup=warmup), path)


def iter_time_figure(
    series: Sequence[tuple[str, Sequence[tuple[Any, Any]], Sequence[tuple[Any, Any]]]],
    *,
    unit: str,
    scale: float,
    warmup: int,
) -> Any:
    """The per-step iteration-time chart as a matplotlib Figure (see :func:`iter_time_series`)."""
    import matplotlib.ticker as mticker
    import numpy as np

    plt = agg_pyplot()
    fig, ax = plt.subplots(figsize=(10, 5))
    cmap = plt.get_cmap("tab10" if len(series) <= 10 else "tab20")
    marked = False
    for i, (label, repeats, outliers) in enumerate(series):
        color = cmap(i % cmap.N)
        for j, (steps, values) in enumerate(repeats):
            x, y = _decimate(steps, values)
            ax.plot(x, y * scale, lw=1.0, color=color, alpha=0.9 if j == 0 else 0.5,
                    label=short_label(label) if j == 0 else None)
        if outliers:
            ax.scatter([s for s, _ in outliers], [v * scale for _, v in outliers], marker="x", s=50,
                       color="#d62728", zorder=4, label=None if marked else "outlier (> 3x run median)")
            marked = True
    if warmup:
        ax.axvspan(ax.get_xlim()[0], warmup + 0.5, color="#999999", alpha=0.15, lw=0, label="warm-up (excluded)")
    ax.set_yscale("log")
    drawn = [np.asarray(v, dtype=float) * scale for _, reps, _ in series for _, v in reps]
    log_span(ax, np.concatenate(drawn) if drawn else [])
    fmt = mticker.FuncFormatter(lambda v, _pos: fmt_num(v))
    ax.yaxis.set_major_locator(mticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(fmt)
    ax.yaxis.set_minor_formatter(mticker.NullFormatter())
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"iteration time ({unit}, log scale)")
    ax.set_title("Iteration time per step (all usable repeats)")
    ax.grid(True, alpha=0.3, which="both")
    n = len(series) + (1 if warmup else 0) + (1 if marked else 0)
    ncol = 1 if n <= 3 else 2 if n <= 8 else 3
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=ncol, fontsize=9, frameon=False)
    fig.tight_layout()
    return fig
