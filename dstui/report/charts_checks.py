"""Charts of the report's checks: revision ratios with intervals, per-step differences of verify runs.

Same conventions as :mod:`dstui.report.charts` (Agg backend, PNG, legend
outside the axes), kept apart so each module stays one screenful of ideas.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dstui.report.charts import agg_pyplot, log_span, save, short_label


def ratio_intervals(rows: Sequence[tuple[str, float, float | None, float | None, str]], path: Path) -> Path:
    """Ratio (revision / baseline iteration time) per comparison with its 95% interval.

    ``rows``: (label, ratio, low, high, note). A comparison without an
    interval (too few repeats) shows its point as a hollow marker and the
    note in the label, so a missing interval is never mistaken for a tight one.
    """
    return save(ratio_figure(rows), path)


def ratio_figure(rows: Sequence[tuple[str, float, float | None, float | None, str]]) -> Any:
    """The ratio chart as a matplotlib Figure: the axis holds 1.0 (no change) and never goes below 0."""
    plt = agg_pyplot()
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.55 * len(rows)))
    ys = list(range(len(rows)))[::-1]
    for y, (_label, ratio, lo, hi, note) in zip(ys, rows, strict=True):
        color = "#2ca02c" if hi is not None and hi < 1 else "#d62728" if lo is not None and lo > 1 else "#4c72b0"
        if lo is not None and hi is not None:
            ax.errorbar([ratio], [y], xerr=[[ratio - lo], [hi - ratio]], fmt="o", color=color, capsize=5, lw=1.6)
            ax.annotate(f"{ratio:.3f} [{lo:.3f}, {hi:.3f}]", (hi, y), textcoords="offset points", xytext=(6, -3), fontsize=8)
        else:
            ax.plot([ratio], [y], "o", mfc="white", color=color)
            ax.annotate(f"{ratio:.3f} (no interval: {note})"[:70], (ratio, y), textcoords="offset points",
                        xytext=(6, -3), fontsize=8)
    ax.axvline(1.0, color="#333333", lw=0.9, ls="--")
    ax.set_yticks(ys)
    ax.set_yticklabels([short_label(r[0], 40) for r in rows], fontsize=9)
    ax.set_xlabel("iteration time ratio, revision / baseline (< 1: faster); bar: 95% Fieller interval")
    ax.set_title("Revisions against the baseline revision (green: faster, red: slower, blue: no clear change)")
    ax.grid(True, axis="x", alpha=0.3)
    ax.margins(x=0.35, y=0.3)
    lo, hi = ax.get_xlim()
    ax.set_xlim(max(0.0, min(lo, 0.9)), max(hi, 1.1))  # a time ratio is positive; 1.0 (no change) in view
    fig.tight_layout()
    return fig


DIFF_KEYS = ("loss_abs_diff", "grad_max_abs_diff", "param_max_abs_diff")
_DIFF_KEYS = (
    ("loss_abs_diff", "|loss - baseline loss|"),
    ("grad_max_abs_diff", "max |grad diff|"),
    ("param_max_abs_diff", "max |param diff|"),
)


def step_differences(
    series: Sequence[tuple[str, dict[str, tuple[Any, Any]], int | None]],
    path: Path,
    *,
    atol: float | None = None,
) -> Path:
    """Per-step differences of verify runs (log scale), one panel per quantity.

    ``series``: (run label, {metric key: (steps, values)}, first diverging
    step or None). The tolerance is drawn as a dashed line and the first
    diverging step as a dotted line in the run's colour, so the reader sees where and by
    how much a run left parity. Each log axis spans at least a decade (and
    holds the tolerance line), so a tiny difference never fills a panel.
    """
    return save(step_differences_figure(series, atol=atol), path)


def step_differences_figure(
    series: Sequence[tuple[str, dict[str, tuple[Any, Any]], int | None]],
    *,
    atol: float | None = None,
) -> Any:
    """The per-step differences chart as a matplotlib Figure (see :func:`step_differences`)."""
    import numpy as np

    plt = agg_pyplot()
    keys = [(k, t) for k, t in _DIFF_KEYS if any(k in h for _, h, _ in series)]
    fig, axes = plt.subplots(len(keys), 1, figsize=(10, 2.6 * len(keys) + 0.8), sharex=True, squeeze=False)
    cmap = plt.get_cmap("tab10")
    for ax, (key, title) in zip(axes[:, 0], keys, strict=True):
        for i, (label, hist, first) in enumerate(series):
            if key not in hist:
                continue
            steps, values = hist[key]
            vals = np.where(np.asarray(values) > 0, values, np.nan)  # log scale: 0 means "equal"
            ax.plot(steps, vals, "o-", ms=3, lw=1.2, color=cmap(i % 10), label=short_label(label))
            if first is not None:  # in the run's colour: with several FAILs the reader sees whose step it is
                ax.axvline(first, color=cmap(i % 10), ls=":", lw=1.4, alpha=0.9)
        if atol is not None and atol > 0 and math.isfinite(atol):
            ax.axhline(atol, color="#333333", ls="--", lw=0.9, label=f"atol {atol:g}")
        ax.set_yscale("log")
        shown = [v for _, h, _ in series if key in h for v in np.asarray(h[key][1], dtype=float).tolist()]
        log_span(ax, shown + ([atol] if atol is not None and atol > 0 and math.isfinite(atol) else []))
        ax.set_ylabel(title, fontsize=9)
        ax.grid(True, alpha=0.3, which="both")
    axes[0, 0].set_title("Per-step differences against the plain-PyTorch baseline\n"
                         "(dotted line: a run's first diverging step; a difference of 0 is not drawn on a log axis)",
                         fontsize=10)  # fmt: skip
    bottom = axes[-1, 0]
    bottom.set_xlabel("optimizer step")
    from matplotlib.ticker import MaxNLocator

    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    handles, labels = axes[0, 0].get_legend_handles_labels()
    bottom.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=3, fontsize=9, frameon=False)
    fig.tight_layout()
    return fig
