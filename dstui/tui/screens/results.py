"""Results: finished runs from MLflow, per condition (or per run), against a baseline.

Loading happens in a thread worker (mlflow, numpy, pandas load there, not at
start-up); the table is then sorted and filtered in memory.
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
from textual.widgets import DataTable, Footer, Header, Input, Select, Static

from dstui.tui.results_table import COLUMNS, View
from dstui.tui.screens.text import TextScreen, mlflow_ui_screen

ALL_BATCHES = "__all__"
__all__ = ["ResultsScreen", "TextScreen"]


class Loaded(Message):
    def __init__(self, results: Any) -> None:
        super().__init__()
        self.results = results


class Exported(Message):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path


class ResultsScreen(Screen):
    TITLE = "Results"
    HELP = """Finished runs from MLflow (child runs tagged dstui.role=run), one row per condition
(g: one per run). Iteration time is the mean ± std over post-warm-up steps, as in reports.
Δ loss is the final loss minus the baseline condition's (b makes the highlighted row the baseline).
time / base: mean iteration time over the baseline's with its 95% Fieller interval over repeats
(the method of reports and `dstui compare`); "too few repeats" below 2 finished runs a side.
Click a column header or press s to sort; / filters by name."""

    BINDINGS = [
        Binding("r", "reload", "Reload"),
        Binding("b", "baseline", "Baseline"),
        Binding("s", "sort", "Sort"),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("g", "group", "Runs/conditions"),
        Binding("e", "export", "Export report"),
        Binding("u", "mlflow_ui", "mlflow ui"),
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

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="results-bar"):
            yield Select([], prompt="experiment", id="experiment", allow_blank=True, compact=True)
            yield Select([], prompt="all batches", id="batch", allow_blank=True, compact=True)
            yield Input(placeholder="/ filter", id="filter", compact=True)
        yield Static(id="results-info")
        yield DataTable(id="results", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#results", DataTable)
        for title, key in COLUMNS:
            table.add_column(title, key=key)
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
        """The table as the screen's current baseline, grouping, sort and filter make it."""
        return View(self.results, self.baseline, self.per_run, self.sort_col, self.sort_reverse, self.filter_text)

    def rows(self) -> list[Any]:
        return self.view().rows()

    def _delta(self, r: Any) -> float | None:
        return self.view().delta(r)

    def _ratio_text(self, r: Any) -> Text:
        return self.view().ratio_text(r)

    def fill(self) -> None:
        table = self.query_one("#results", DataTable)
        table.clear()
        view = self.view()
        for r in view.rows():
            table.add_row(*view.cells(r))
        self.query_one("#results-info", Static).update(view.info())

    @on(DataTable.HeaderSelected, "#results")
    def _header(self, event: DataTable.HeaderSelected) -> None:
        if event.column_index == self.sort_col:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_col, self.sort_reverse = event.column_index, False
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

    # -- export and mlflow ui ----------------------------------------------------

    def action_export(self) -> None:
        if not self.experiment:
            self.notify("nothing to report yet", severity="warning")
            return
        from dstui.core import paths

        stamp = time.strftime("%Y%m%d-%H%M%S")
        out = paths.home() / "reports" / f"{self.experiment}-{stamp}"
        self.notify(f"exporting report to {out} …")
        base = self.view().base_condition()
        self.export(self.experiment, out, self.batch, base.label if base is not None else None)

    @work(thread=True, exclusive=True, group="export", exit_on_error=False, name="report export")
    def export(self, experiment: str, out: Path, batch: str | None, baseline: str | None) -> None:
        try:
            from dstui.report import markdown as report
        except ImportError:
            self.app.call_from_thread(
                self.notify,
                "report export is not available in this version yet (dstui.report.markdown is missing)",
                severity="warning",
            )
            return
        path = report.export_report(experiment, out, batch=batch, baseline=baseline)
        self.post_message(Exported(Path(path)))

    def on_exported(self, message: Exported) -> None:
        self.notify(f"report written: {message.path}", timeout=10)

    def action_mlflow_ui(self) -> None:
        self.app.push_screen(mlflow_ui_screen())
