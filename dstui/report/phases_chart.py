"""The time-breakdown chart of a report: one stacked horizontal bar per run, launch to teardown.

Fed by dstui.analysis.phases.time_table. Segments keep one colour each across
runs so a reader compares, e.g., the launch share of every condition at a glance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dstui.core.phases import SEGMENTS
from dstui.report.charts import agg_pyplot, save, short_label

COLORS = {
    "launch": "#8c8c8c",
    "imports": "#c7c7c7",
    "init": "#ff7f0e",
    "compile": "#d62728",
    "steps": "#2ca02c",
    "teardown": "#9467bd",
}


def phase_bars(table: Any, path: Path, *, title: str = "Where the wall time went") -> Path:
    """Write a stacked bar per row of ``table`` (seconds per segment); the step share labels each bar."""
    return save(phase_figure(table, title=title), path)


def phase_figure(table: Any, *, title: str = "Where the wall time went") -> Any:
    """The stacked bars as a matplotlib Figure; the time axis starts at zero (bars are durations)."""
    plt = agg_pyplot()
    labels = [str(x) for x in table.index]
    n = len(labels)
    fig, ax = plt.subplots(figsize=(10, max(2.2, 0.45 * n + 1.5)))
    ys = list(range(n))[::-1]
    left = [0.0] * n
    for seg in SEGMENTS:
        widths = [float(v) if v == v and v is not None else 0.0 for v in table[seg]]  # NaN -> 0
        ax.barh(ys, widths, left=left, color=COLORS[seg], label=seg, alpha=0.9)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    span = max(left + [1e-9])
    for y, total, share in zip(ys, left, table["step_share"], strict=True):
        text = f"{total:.1f} s"
        if share == share and share is not None:  # not NaN
            text += f", steps {share:.0%}"
        ax.text(total + span * 0.01, y, text, va="center", ha="left", fontsize=9)
    ax.set_yticks(ys)
    ax.set_yticklabels([short_label(lab) for lab in labels], fontsize=9)
    ax.set_xlim(0, span * 1.3)
    ax.set_xlabel("wall time (s)")
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig
