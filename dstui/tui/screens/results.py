"""Results: finished runs from MLflow, per condition (or per run), against a baseline.

Loading happens in a thread worker (mlflow, numpy, pandas load there, not at
start-up); the table is then sorted and filtered in memory. Runs picked with
space stay picked while the user switches batch or experiment, so a pick can
span both; c charts the picked runs together (dstui/tui/screens/results_chart.py)
and e exports them to a report through the report's entry point.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Header, Input, Select, Static

from dstui.tui.results_table import COLUMNS, View
from dstui.tui.screens.text import mlflow_ui_screen
from dstui.tui.widgets.fitting_footer import FittingFooter

ALL_BATCHES = "__all__"
__all__ = ["ResultsScreen"]


class Loaded(Message):
    def __init__(self, results: Any) -> None:
        super().__init__()
        self.results = results


class Exported(Message):
    def __init__(self, path: Path, where: str = "") -> None:
        super().__init__()
        self.path = path
        self.where = where  # the MLflow parent runs it was logged to (or why not)


class ResultsScreen(Screen):
    TITLE = "Results"
    AUTO_FOCUS = "#results"  # the table: space picks (a focused Select would take it)
    # one string per paragraph: the help screen wraps them to its width (a hard-wrapped line would break twice)
    HELP = (
        "Finished runs from MLflow (child runs tagged dstui.role=run), one row per condition "
        "(g: one per run). Iteration time is the mean ± std over post-warm-up steps, as in reports.\n"
        "Δ loss is the final loss minus the baseline condition's (b makes the highlighted row the baseline). "
        "time / base: mean iteration time over the baseline's with its 95% Fieller interval over repeats "
        "(the method of reports and `dstui compare`); \"too few repeats\" below 2 finished runs a side.\n"
        "Click a column header or press s to sort; / filters by name, batch, status or any param/tag as "
        "key=value (several words: all must match, e.g. \"zero_stage=2 bf16\").\n"
        "space picks the highlighted condition's runs (or the run, with g), a picks every row shown, x clears; "
        "picks stay while you switch batch or experiment. c charts the picked runs together (loss, iteration "
        "time, memory, tokens/s: mean line and min-max band over the repeats of each condition and batch); "
        "e exports the picked runs to a report (nothing picked: the experiment or batch shown).\n"
        "Narrow terminals leave out tok/s, Δ loss, runs, time/base, peak mem, in that order."
    )

    BINDINGS = [
        Binding("space", "pick", "Pick"),
        Binding("c", "chart", "Chart"),
        Binding("e", "export", "Export"),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("g", "group", "Runs/conds"),
        Binding("b", "baseline", "Baseline"),
        Binding("s", "sort", "Sort"),
        Binding("r", "reload", "Reload", show=False),
        Binding("a", "pick_shown", "Pick all shown", show=False),
        Binding("x", "clear_picks", "Clear picks", show=False),
        Binding("u", "mlflow_ui", "mlflow ui", show=False),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.results: Any = None
        self.experiment: str | None = None
        self.batch: str | None = None
        self.baseline: str | None = None
        self.per_run = False
        self.sort_col = 0
        self.sort_reverse = False
        self.filter_text = ""
        self._filling = False
        self.picked: dict[str, Any] = {}  # run id -> RunData (with history), kept across reloads
        self.picked_experiment: dict[str, str] = {}  # run id -> its experiment
        self._layout_for: tuple | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="results-bar"):
            yield Select([], prompt="experiment", id="experiment", allow_blank=True, compact=True)
            yield Select([], prompt="all batches", id="batch", allow_blank=True, compact=True)
            yield Input(placeholder="/ filter", id="filter", compact=True)
        yield Static(id="results-info")
        yield DataTable(id="results", cursor_type="row", zebra_stripes=True)
        yield FittingFooter()

    def on_mount(self) -> None:
        self.query_one("#results-info", Static).update(Text("loading from MLflow…", style="dim"))
        self.load()

    # -- loading ---------------------------------------------------------------

    def action_reload(self) -> None:
        self.query_one("#results-info", Static).update(Text("loading from MLflow…", style="dim"))
        self.load()

    @work(thread=True, exclusive=True, group="results", exit_on_error=False, name="results")
    def load(self) -> None:
        from dstui.tui import results_data

        self.post_message(Loaded(results_data.load(self.experiment, self.batch)))

    def on_loaded(self, message: Loaded) -> None:
        res = message.results
        self.results = res
        self.experiment = res.experiment or None
        if self.baseline not in {c.label for c in res.conditions}:
            self.baseline = res.default_baseline
        self._filling = True
        with self.prevent(Select.Changed):
            exp = self.query_one("#experiment", Select)
            exp.set_options([(n, n) for n in res.experiments])
            if res.experiment:
                exp.value = res.experiment
            bsel = self.query_one("#batch", Select)
            bsel.set_options([(b, b) for b in res.batches])
            if self.batch in res.batches:
                bsel.value = self.batch
        self._filling = False
        self.fill()

    @on(Select.Changed, "#experiment")
    def _experiment_changed(self, event: Select.Changed) -> None:
        if self._filling or event.value is Select.BLANK:
            return
        self.experiment = str(event.value)
        self.batch = None
        self.action_reload()

    @on(Select.Changed, "#batch")
    def _batch_changed(self, event: Select.Changed) -> None:
        if self._filling:
            return
        self.batch = None if event.value is Select.BLANK else str(event.value)
        self.action_reload()

    # -- table ---------------------------------------------------------------

    def view(self) -> View:
        """The table as the screen's current baseline, grouping, sort, filter and picks make it."""
        return View(self.results, self.baseline, self.per_run, self.sort_col, self.sort_reverse, self.filter_text,
                    frozenset(self.picked))  # fmt: skip

    def rows(self) -> list[Any]:
        return self.view().rows()

    def _delta(self, r: Any) -> float | None:
        return self.view().delta(r)

    def _ratio_text(self, r: Any) -> Text:
        return self.view().ratio_text(r)

    def on_resize(self) -> None:
        if self.results is not None:
            self.fill()

    def fill(self) -> None:
        """The rows, in the columns that fit the screen's width (status cut with … to what is left)."""
        table = self.query_one("#results", DataTable)
        cursor = table.cursor_row
        view = self.view()
        width = (table.size.width or self.size.width) - 2  # the vertical scrollbar
        cols = view.layout(width)
        table.clear(columns=True)
        for title, key, w in cols:
            table.add_column(title, key=key, width=w)
        for r in view.rows():
            m = view.cell_map(r)
            cells = []
            for _, key, w in cols:
                c = m[key]
                c = c.copy() if isinstance(c, Text) else Text(str(c))
                c.truncate(w, overflow="ellipsis")
                cells.append(c)
            table.add_row(*cells)
        if table.row_count:
            table.move_cursor(row=min(cursor, table.row_count - 1))
        self.query_one("#results-info", Static).update(view.info())

    @on(DataTable.HeaderSelected, "#results")
    def _header(self, event: DataTable.HeaderSelected) -> None:
        keys = [key for _, key in COLUMNS]
        col = keys.index(str(event.column_key.value)) if event.column_key.value in keys else event.column_index
        if col == self.sort_col:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_col, self.sort_reverse = col, False
        self.fill()

    def action_sort(self) -> None:
        if self.sort_reverse:
            self.sort_col = (self.sort_col + 1) % len(COLUMNS)
        self.sort_reverse = not self.sort_reverse
        self.fill()

    def action_group(self) -> None:
        self.per_run = not self.per_run
        self.fill()

    def action_filter(self) -> None:
        self.query_one("#filter", Input).focus()

    def action_clear_filter(self) -> None:
        inp = self.query_one("#filter", Input)
        inp.value = ""
        self.query_one("#results", DataTable).focus()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value.strip()
        self.fill()

    @on(Input.Submitted, "#filter")
    def _filter_done(self) -> None:
        self.query_one("#results", DataTable).focus()

    def action_baseline(self) -> None:
        table = self.query_one("#results", DataTable)
        rows = self.rows()
        if not rows or table.cursor_row >= len(rows):
            return
        self.baseline = rows[table.cursor_row].label
        self.notify(f"baseline: {self.baseline}", timeout=3)
        self.fill()

    # -- picking runs across batches and experiments ---------------------------------

    def _highlighted(self) -> Any:
        rows = self.rows()
        table = self.query_one("#results", DataTable)
        return rows[table.cursor_row] if rows and table.cursor_row < len(rows) else None

    def _pick(self, rows: list[Any], on: bool | None = None) -> None:
        """Pick (or unpick) the runs behind rows; a row whose runs are all picked is unpicked."""
        if self.results is None:
            return
        ids = [i for r in rows for i in r.run_ids if i in self.results.run_data]
        if on is None:
            on = not all(i in self.picked for i in ids)
        for i in ids:
            if on:
                self.picked[i] = self.results.run_data[i]
                self.picked_experiment[i] = self.results.experiment
            else:
                self.picked.pop(i, None)
                self.picked_experiment.pop(i, None)
        self.fill()

    def action_pick(self) -> None:
        row = self._highlighted()
        if row is not None:
            self._pick([row])
            table = self.query_one("#results", DataTable)
            if table.cursor_row < table.row_count - 1:
                table.move_cursor(row=table.cursor_row + 1)

    def action_pick_shown(self) -> None:
        self._pick(self.rows(), on=True)

    def action_clear_picks(self) -> None:
        self.picked.clear()
        self.picked_experiment.clear()
        self.fill()

    def chart_runs(self) -> list[Any]:
        """What c charts: the picked runs, else the runs of the rows shown."""
        if self.picked:
            return list(self.picked.values())
        if self.results is None:
            return []
        for i in (i for r in self.rows() for i in r.run_ids):
            self.picked_experiment.setdefault(i, self.results.experiment)
        return [self.results.run_data[i] for r in self.rows() for i in r.run_ids if i in self.results.run_data]

    def action_chart(self) -> None:
        from dstui.tui.screens.results_chart import ResultsChartScreen

        runs = self.chart_runs()
        if not runs:
            self.notify("nothing to chart: pick runs with space", severity="warning")
            return
        self.app.push_screen(ResultsChartScreen(runs, dict(self.picked_experiment), export=self.action_export))

    # -- export and mlflow ui ----------------------------------------------------

    def action_export(self) -> None:
        if not self.experiment:
            self.notify("nothing to report yet", severity="warning")
            return
        from dstui.core import paths

        stamp = time.strftime("%Y%m%d-%H%M%S")
        base = self.view().base_condition()
        baseline = base.label if base is not None else None
        if self.picked:
            ids = list(self.picked)
            experiment = self.picked_experiment.get(ids[0], self.experiment)
            labels = {r.label or r.condition for r in self.picked.values()}
            out = paths.home() / "reports" / f"picked-{stamp}"
            self.notify(f"exporting {len(ids)} picked runs to {out} …")
            self.export(experiment, out, None, baseline if baseline in labels else None, ids)
            return
        out = paths.home() / "reports" / f"{self.experiment}-{stamp}"
        self.notify(f"exporting report to {out} …")
        self.export(self.experiment, out, self.batch, baseline)

    @work(thread=True, exclusive=True, group="export", exit_on_error=False, name="report export")
    def export(
        self, experiment: str, out: Path, batch: str | None, baseline: str | None, run_ids: list[str] | None = None
    ) -> None:
        try:
            from dstui.usecases import report
        except ImportError:
            self.app.call_from_thread(
                self.notify,
                "report export is not available in this version yet (dstui.usecases.report is missing)",
                severity="warning",
            )
            return
        try:
            if run_ids:  # the picked runs, whatever their batch or experiment (the report takes ids as they are)
                done = report.export(experiment, out, runs=run_ids, baseline=baseline)
            else:
                done = report.export(experiment, out, batch=batch, baseline=baseline)
        except Exception as e:  # noqa: BLE001 - any failure is the user's to read, not a traceback
            self.app.call_from_thread(self.notify, f"report export failed: {str(e)[:300]}", severity="error")
            return
        self.post_message(Exported(Path(done.report), done.where()))

    def on_exported(self, message: Exported) -> None:
        self.notify(f"report written: {message.path}; {message.where}", timeout=10)

    def action_mlflow_ui(self) -> None:
        self.app.push_screen(mlflow_ui_screen())
