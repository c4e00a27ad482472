"""Results charts: picked runs (any batches, any experiments) on one set of charts.

Loss, iteration time, peak memory and tokens/s per step; one line per group of
repeats (condition label x batch x experiment: the mean) with its min-max band
dimmed. The curves are computed in a thread worker from the histories the
results screen loaded (dstui/tui/results_chart_data.py); the widgets only draw.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Header, Static

from dstui.core.formatting import fmt_num
from dstui.core.metric_catalogue import BY_NAME, BYTES, TIME
from dstui.tui import results_chart_data as data
from dstui.tui.chart_pages import charts_per_page, grid_shape
from dstui.tui.chart_view import Curve
from dstui.tui.live_draw import byte_scale, time_scale
from dstui.tui.widgets.charts import MetricPlot, color
from dstui.tui.widgets.fitting_footer import FittingFooter


class ChartData(Message):
    def __init__(self, groups: list[data.Group], curves: dict[str, list[Curve]]) -> None:
        super().__init__()
        self.groups = groups
        self.curves = curves


class ResultsChartScreen(Screen):
    TITLE = "Results charts"
    # one string per paragraph: the help screen wraps them to its width (a hard-wrapped line would break twice)
    HELP = (
        "The picked runs on one set of charts: one line per condition and batch (and experiment when the "
        "pick spans several), the mean over its repeats at each step, with the min-max band of the repeats dimmed.\n"
        "The y-axis is set from the steps after warm-up for iteration time (w hides the warm-up steps); l: log scale.\n"
        "Groups whose curves coincide are drawn once as a line and the others as markers on it (the title says so).\n"
        "c pages through the charts when the terminal is small; e exports the picked runs to a report."
    )

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("l", "log_scale", "Log y"),
        Binding("w", "warmup", "Warm-up"),
        Binding("c", "next_charts", "Charts"),
        Binding("e", "export", "Export"),
    ]

    PLOT_IDS = tuple(f"#rplot-{key}" for key, _ in data.METRICS)

    def __init__(self, runs: list[Any], experiment_of: dict[str, str], *, export: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.runs = runs
        self.experiment_of = experiment_of
        self._export = export
        self.groups: list[data.Group] = []
        self.log_y = False
        self.hide_warmup = False
        self.chart_page = 0

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(Text("computing…", style="dim"), id="chart-legend")
        with Grid(id="rplots"):
            for key, title in data.METRICS:
                yield MetricPlot(title, id=f"rplot-{key}")
        yield FittingFooter()

    def on_mount(self) -> None:
        self.sub_title = f"{len(self.runs)} runs"
        self.compute()

    def on_resize(self) -> None:
        self._layout_charts()

    # -- data (worker) --------------------------------------------------------------

    @work(thread=True, exclusive=True, group="results-chart", exit_on_error=False, name="results charts")
    def compute(self) -> None:
        groups = data.group_runs(self.runs, self.experiment_of)
        self.post_message(ChartData(groups, {key: data.curves_for(groups, key) for key, _ in data.METRICS}))

    def on_chart_data(self, message: ChartData) -> None:
        self.groups = message.groups
        for key, title in data.METRICS:
            plot = self.query_one(f"#rplot-{key}", MetricPlot)
            curves = message.curves[key]
            if not curves:
                plot.set_empty(f"no {title} logged")
                continue
            top = max((max(c.y) for c in curves if len(c.y)), default=0.0)
            scale, unit = (1.0, "")
            kind = BY_NAME[key].scale
            if kind == TIME:  # the unit from the steps after warm-up, as the axis is set
                steady = [y for c in curves for x, y in zip(c.x, c.y, strict=True) if x > c.warmup]
                scale, unit = time_scale(max(steady, default=top))
            elif kind == BYTES:
                scale, unit = byte_scale(top)
            plot.set_curves(curves, scale=scale, unit=unit, title=title)
        self.query_one("#chart-legend", Static).update(self.legend())

    def legend(self) -> Text:
        parts: list[Any] = []
        marks = {d.label: d for d in self.plots()[0].drawn}
        for i, g in enumerate(self.groups):
            rgb = color(i)
            d = marks.get(g.name)
            glyph = d.marker if d is not None and d.marker != "line" else "■"
            parts += [(f"{glyph} {g.name}", f"bold rgb({rgb[0]},{rgb[1]},{rgb[2]})"), (f" n={len(g.runs)}", "dim")]
            if d is not None and d.same_as:
                parts.append((f" (loss = {d.same_as})", "italic"))
            loss = [r.stats.get("final_loss") for r in g.runs]
            loss = [v for v in loss if isinstance(v, (int, float))]
            if loss:
                parts.append((f" loss {fmt_num(sum(loss) / len(loss))}", "dim"))
            parts.append("   ")
        if len(self.groups) and any(len(g.runs) > 1 for g in self.groups):
            parts.append(("(line: mean of repeats, dim: min-max)", "dim"))
        return Text.assemble(*parts)

    # -- layout and keys ----------------------------------------------------------------

    def plots(self) -> list[MetricPlot]:
        return [self.query_one(pid, MetricPlot) for pid in self.PLOT_IDS]

    def visible_plots(self) -> list[MetricPlot]:
        return [p for p in self.plots() if p.display]

    def _layout_charts(self) -> None:
        # no log pane here, but the legend can take 3 rows: 2 more than the live view at most
        per = charts_per_page(self.size.width, self.size.height + 2)
        pages = (len(self.PLOT_IDS) + per - 1) // per
        self.chart_page %= pages
        shown = range(self.chart_page * per, (self.chart_page + 1) * per)
        for i, plot in enumerate(self.plots()):
            plot.display = i in shown
        cols, rows = grid_shape(per, self.size.width, self.size.height + 2)
        grid = self.query_one("#rplots", Grid)
        grid.styles.grid_size_columns = cols
        grid.styles.grid_size_rows = rows
        self.refresh_bindings()
        self.sub_title = f"{len(self.runs)} runs" + (f" · charts {self.chart_page + 1}/{pages} (c)" if pages > 1 else "")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "next_charts":  # c only where the charts are paged (hidden from the footer otherwise)
            return charts_per_page(self.size.width, self.size.height + 2) < len(self.PLOT_IDS)
        return True

    def action_next_charts(self) -> None:
        self.chart_page += 1
        self._layout_charts()

    def action_log_scale(self) -> None:
        self.log_y = not self.log_y
        for plot in self.plots():
            plot.set_options(log_y=self.log_y)

    def action_warmup(self) -> None:
        self.hide_warmup = not self.hide_warmup
        for plot in self.plots():
            plot.set_options(hide_warmup=self.hide_warmup)

    def action_export(self) -> None:
        if self._export is not None:
            self._export()
