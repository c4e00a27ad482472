"""What the live view draws from its runs' series: the plots (one table of them) and the legend line.

The live screen (dstui/tui/screens/live.py) reads the folders and owns the
series; these functions only turn series into curves, scales and text, on
the main thread, so the screen stays about reading and keys. Which plots there
are, in which order, and how each is drawn is :data:`PLOTS`: the screen makes
its widgets and redraws from that table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text

from dstui.core.formatting import fmt_bytes, fmt_num
from dstui.core.metric_catalogue import BY_NAME, TIME, skips_warmup
from dstui.core.phases import from_status, live_text
from dstui.tui.chart_view import Curve, Drawn
from dstui.tui.series import RunSeries
from dstui.tui.widgets.charts import MetricPlot, color
from dstui.tui.widgets.time_bar import stacked_bar

SYSTEM_VIEWS = {
    "gpu_util": ("GPU util", "%", 1.0),
    "gpu_mem": ("GPU memory", "GiB", 1024**3),
    "gpu_power": ("GPU power", "W", 1.0),
    "cpu": ("job CPU", "%", 1.0),
    "rss": ("job RSS", "GiB", 1024**3),
}


LOG_BAR_WIDTH = 20  # the log title is one line: run name, key hints and this bar fit 100 columns


def byte_scale(max_value: float) -> tuple[float, str]:
    for scale, unit in ((1024**3, "GiB"), (1024**2, "MiB"), (1024, "KiB")):
        if max_value >= scale:
            return float(scale), unit
    return 1.0, "B"


def time_scale(max_value: float) -> tuple[float, str]:
    return (1e-3, "ms") if max_value < 1.0 else (1.0, "s")


def draw_steps(plot: MetricPlot, series: Sequence[RunSeries], key: str, label: str, smooth: bool) -> None:
    """Loss or iteration time per step: raw (dimmed when smoothing) plus the EMA."""
    curves: list[Curve] = []
    top = 0.0
    skip = skips_warmup(key)  # the warm-up's loss is real; its iteration times are compile spikes
    for i, s in enumerate(series):
        raw = s.steps[key]
        if smooth:
            curves.append(Curve(s.name, i, raw.x, raw.y, raw=True, warmup=s.warmup, range_skips_warmup=skip))
        sm = (s.smooth if smooth else s.steps)[key]
        curves.append(Curve(s.name, i, sm.x, sm.y, warmup=s.warmup, range_skips_warmup=skip))
        if len(raw):
            top = max(top, max(raw.y[-50:]))  # the unit from recent steps, not the warm-up spike
    if not any(len(c.x) for c in curves):
        plot.set_empty("waiting for data")
        return
    scale, unit = time_scale(top) if BY_NAME[key].scale == TIME else (1.0, "")
    plot.set_curves(curves, scale=scale, unit=unit, title=label + (" (EMA)" if smooth else ""))


def draw_memory(plot: MetricPlot, series: Sequence[RunSeries], mem_key: str) -> None:
    """Peak or allocated memory per step, in the largest binary unit that fits."""
    curves = []
    top = 0.0
    for i, s in enumerate(series):
        buf = s.steps[mem_key]
        curves.append(Curve(s.name, i, buf.x, buf.y, warmup=s.warmup, range_skips_warmup=skips_warmup(mem_key)))
        if len(buf):
            top = max(top, max(buf.y))
    scale, unit = byte_scale(top)
    title = BY_NAME[mem_key].title
    plot.title = title
    if not any(len(c.x) for c in curves):
        plot.set_empty("waiting for data")
    else:
        plot.set_curves(curves, scale=scale, unit=unit, title=title)


def draw_system(plot: MetricPlot, series: Sequence[RunSeries], key: str | None) -> None:
    if key is None:
        plot.set_empty("no system readings yet")
        return
    name, unit, sc = SYSTEM_VIEWS[key]
    curves = [Curve(s.name, i, s.system[key].x, s.system[key].y) for i, s in enumerate(series)]
    plot.set_curves(curves, scale=sc, unit=unit, title=name)


@dataclass(frozen=True)
class LiveChoices:
    """What the user chose to see (keys s, m, y)."""

    smooth: bool = False
    mem_key: str = "mem_peak"  # or mem_alloc
    system_key: str | None = None  # a SYSTEM_VIEWS key the runs have, None before any reading


@dataclass(frozen=True)
class LivePlot:
    id: str  # the widget's id (tests and the CSS name it)
    title: str  # before any data
    xlabel: str
    draw: Callable[[MetricPlot, Sequence[RunSeries], LiveChoices], None]


def _steps_plot(plot_id: str, key: str) -> LivePlot:
    """A plot of one metric of the catalogue per step (its title, unit and warm-up rule are the catalogue's)."""
    title = BY_NAME[key].title
    return LivePlot(plot_id, title, "step", lambda p, s, c: draw_steps(p, s, key, title, c.smooth))


PLOTS: tuple[LivePlot, ...] = (
    _steps_plot("plot-loss", "loss"),
    _steps_plot("plot-iter", "iter_time"),
    LivePlot("plot-mem", BY_NAME["mem_peak"].title, "step", lambda p, s, c: draw_memory(p, s, c.mem_key)),
    LivePlot("plot-sys", "system", "seconds", lambda p, s, c: draw_system(p, s, c.system_key)),
)


def newest_running(statuses: Sequence[dict[str, Any]]) -> int | None:
    """The index of the running run started last (ties: the later in the view), or None when none runs."""
    best: tuple[float, int] | None = None
    for i, st in enumerate(statuses):
        if st.get("state") != "running":
            continue
        started = st.get("started")
        key = (float(started) if isinstance(started, (int, float)) and not isinstance(started, bool) else 0.0, i)
        if best is None or key > best:
            best = key
    return None if best is None else best[1]


def available_system(series: Sequence[RunSeries]) -> list[str]:
    """The system readings any of the runs has, in SYSTEM_VIEWS order (GPU ones first)."""
    have = {k for s in series for k, b in s.system.items() if len(b)}
    return [k for k in SYSTEM_VIEWS if k in have]


def _system_text(sysl: dict[str, float]) -> str:
    if "gpu_util" in sysl:
        return f" gpu {sysl['gpu_util']:.0f}%" + (f" {sysl['gpu_power']:.0f}W" if "gpu_power" in sysl else "")
    if "cpu" in sysl:
        return f" cpu {sysl['cpu']:.0f}%"
    return ""


def legend(
    series: Sequence[RunSeries],
    statuses: Sequence[dict[str, Any]],
    marks: dict[str, Drawn] | None = None,
    log_run: str = "",
) -> Text:
    """One entry per run: colour, state, progress, last loss and memory, system reading, guard flag.

    ``marks`` (the loss chart's :class:`Drawn` per run) turns the ■ of a run whose loss coincides
    with another's into its marker glyph and says which run it is drawn on; the run whose log is
    shown below is underlined.
    """
    parts: list[Text | str | tuple[str, str]] = []
    marks = marks or {}
    groups: dict[str, int] = {}
    for d in marks.values():
        if d.same_as:
            groups[d.same_as] = groups.get(d.same_as, 1) + 1
    for i, (s, st) in enumerate(zip(series, statuses, strict=True)):
        rgb = color(i)
        last = st.get("last") or {}
        loss = s.steps["loss"].y[-1] if len(s.steps["loss"]) else last.get("loss")
        mem = s.steps["mem_peak"].y[-1] if len(s.steps["mem_peak"]) else last.get("mem_peak")
        d = marks.get(s.name)
        glyph = d.marker if d is not None and d.marker != "line" else "■"
        style = f"bold rgb({rgb[0]},{rgb[1]},{rgb[2]})"
        parts += [
            (f"{glyph} ", style),
            (s.name, style + (" underline" if s.name == log_run else "")),
            " ",
        ]
        if d is not None and d.same_as:
            parts.append((f"(loss = {d.same_as}) ", "italic"))
        elif s.name in groups:
            parts.append((f"({groups[s.name]} identical) ", "italic"))
        phase = live_text(st, width=32) if not st.get("steps_done") else ""
        progress = phase or f"{st.get('steps_done') or 0}/{st.get('steps_total') or '?'}"
        parts += [
            (f"{st.get('state', '?')} ", "dim"),
            (progress, "yellow") if phase else (progress, "dim"),
            f" loss {fmt_num(loss)} mem {fmt_bytes(mem)}{_system_text(s.system_last)}",
        ]
        diverged = (st.get("diverged") or {}).get("message")
        if diverged:  # the guard flagged this run (dstui/execute/guard.py): say so in red
            parts.append((f" {diverged}", "bold red"))
        parts.append("   ")
    return Text.assemble(*parts)


def log_title(
    run: str, status: dict[str, Any] | None, *, following: bool = False, running: bool = False, page: str = ""
) -> Text:
    """'log RUN' and how the pane chooses its run (following the running one, or picked with n),
    the chart page when the charts are paged, and a small stacked bar of where the run's time went
    once it has ended (the colours of the runs screen's time bar, which has the legend)."""
    if not running:
        how = "  (n: next run, o: full log)"
    else:
        how = "  (following the running run)" if following else "  (n: next run, f: follow running)"
    text = Text.assemble(("log ", "dim"), (run, "bold"), (how, "dim"))
    if page:
        text.append(f"  charts {page} (c)", style="dim")
    times = from_status(status or {})
    if times is not None and times.wall is not None:
        text.append("  time ", style="dim")
        text.append_text(stacked_bar(times, LOG_BAR_WIDTH))
    return text
