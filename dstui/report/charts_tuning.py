"""The tuning chart: each probe's predicted step time against the one it measured.

Points on the diagonal were predicted right; above it, predicted too slow. The
vertical bar is the prediction's 90% interval when the probe was chosen, the
horizontal bar the measurement's 95% interval. Both axes are logarithmic and
equal (a space's step times span orders of magnitude), at least a decade wide.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dstui.analysis.tuning import TuneSummary
from dstui.report import charts

Z90 = 1.645


def predicted_vs_measured_figure(summary: TuneSummary) -> Any | None:
    """The matplotlib Figure; None when no probe has both a prediction and a measurement."""
    import math

    pts = [r for r in summary.ranking if r.predicted_s and r.measured_s]
    if not pts:
        return None
    from matplotlib.figure import Figure  # no pyplot: nothing global, safe from any thread

    unit, scale = charts.time_unit([max(r.predicted_s or 0, r.measured_s or 0) for r in pts])
    fig = Figure(figsize=(6.4, 5.2))
    ax = fig.add_subplot()
    values: list[float] = []
    for r in pts:
        x, y = (r.measured_s or 0) * scale, (r.predicted_s or 0) * scale
        sd = r.predicted_log_sd if r.predicted_log_sd is not None and math.isfinite(r.predicted_log_sd) else 0.0
        lo, hi = y * math.exp(-Z90 * sd), y * math.exp(Z90 * sd)
        half = min((r.measured_half_s or 0) * scale, 0.95 * x)  # a log axis cannot show a bar through zero
        color = "#d62728" if r.winner else "#1f77b4"
        ax.errorbar([x], [y], yerr=[[y - lo], [hi - y]], xerr=[[half], [half]], fmt="o", color=color,
                    ecolor=color, alpha=0.8, capsize=3)  # fmt: skip
        ax.annotate(charts.short_label(r.candidate, 24), (x, y), textcoords="offset points", xytext=(5, 4), fontsize=7)
        values += [x, y]
    # step times of a space span orders of magnitude (ZeRO-3 on CPU ranks: 100x): log axes, the same on both
    # sides so the diagonal is the diagonal, at least a decade wide (the report's rule for log axes)
    lo, hi = min(values) / 1.5, max(values) * 1.5
    if hi / lo < 10:
        mid = math.sqrt(lo * hi)
        lo, hi = mid / math.sqrt(10), mid * math.sqrt(10)
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):  # 20, 50, 100, 200 ...: plain numbers, three a decade
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())
    ax.plot([lo, hi], [lo, hi], color="#7f7f7f", linestyle="--", linewidth=1, label="predicted = measured")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(f"measured step time ({unit}, log; bar: 95% interval)")
    ax.set_ylabel(f"predicted step time ({unit}, log; bar: 90% interval)")
    ax.set_title("Tuning: predicted vs measured step time per probe (red: winner)", fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return fig


def save_predicted_vs_measured(summary: TuneSummary, path: Path) -> Path | None:
    fig = predicted_vs_measured_figure(summary)
    return charts.save(fig, path) if fig is not None else None
