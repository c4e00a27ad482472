"""Results: finished runs from MLflow, per condition (or per run), against a baseline.

Loading happens in a thread worker (mlflow, numpy, pandas load there, not at
start-up); the table is then sorted and filtered in memory.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Header, Input, Select, Static

from dstui.analysis.intervals import RatioInterval, fieller_ratio
from dstui.core.formatting import fmt_bytes, fmt_interval, fmt_num

ALL_BATCHES = "__all__"
COLUMNS = (
    ("condition", "label"),
    ("runs", "runs"),
    ("iter time (s) mean ± std", "iter_mean"),
    ("tok/s", "tokens_per_s"),
    ("peak mem", "mem_peak"),
    ("final loss", "final_loss"),
    ("Δ loss vs base", "delta"),
    ("status / reason", "status"),
    ("time / base [95% CI]", "ratio"),
)


class Loaded(Message):
    def __init__(self, results: Any) -> None:
        super().__init__()
        self.results = results


class Exported(Message):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path


class TextScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,enter", "dismiss", "Close")]

    def __init__(self, title: str, body: str) -> None:
        super().__init__()
        self.title_text = title
        self.body = body

    def compose(self) -> ComposeResult:
        with Vertical(id="text-box"):
            yield Static(Text(self.title_text, style="bold"))
            yield Static(self.body, id="text-body")
            yield Static(Text("escape closes", style="dim"))


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

    def rows(self) -> list[Any]:
        if self.results is None:
            return []
        rows = list(self.results.runs if self.per_run else self.results.conditions)
        if self.filter_text:
            f = self.filter_text.lower()
            rows = [r for r in rows if f in f"{r.label} {r.run_name} {r.batch} {r.status}".lower()]
        key = COLUMNS[self.sort_col][1]
        if self.sort_col == 0 and not self.sort_reverse:
            return rows  # spec order
        if key in ("label", "runs", "status"):
            rows.sort(key=lambda r: str(r.run_name or r.label) if key == "label" else str(getattr(r, key)), reverse=self.sort_reverse)
        else:
            def num(r: Any) -> float:
                if key == "ratio":
                    ri = self._ratio(r)
                    v = None if ri is None else ri.ratio
                else:
                    v = self._delta(r) if key == "delta" else getattr(r, key)
                return float("inf") if v is None else v

            rows.sort(key=num, reverse=self.sort_reverse)
        return rows

    def _base_loss(self) -> float | None:
        if self.results is None or not self.baseline:
            return None
        for c in self.results.conditions:
            if c.label == self.baseline:
                return c.final_loss
        return None

    def _delta(self, r: Any) -> float | None:
        base = self._base_loss()
        if base is None or r.final_loss is None:
            return None
        return r.final_loss - base

    def _ratio(self, r: Any) -> RatioInterval | None:
        """Iteration time against the baseline condition: the report's and compare's interval (Fieller)."""
        if self.results is None or not self.baseline or self.per_run or r.label == self.baseline:
            return None
        base = next((c for c in self.results.conditions if c.label == self.baseline), None)
        if base is None or not r.run_means or not base.run_means:
            return None
        return fieller_ratio(r.run_means, base.run_means)

    def fill(self) -> None:
        table = self.query_one("#results", DataTable)
        table.clear()
        res = self.results
        for r in self.rows():
            it = "-" if r.iter_mean is None else f"{r.iter_mean:.4f} ± {r.iter_std or 0:.4f}"
            delta = self._delta(r)
            is_base = r.label == self.baseline
            label = Text(r.run_name or r.label, style="bold" if is_base else "")
            if is_base and not self.per_run:
                label.append(" (base)", style="cyan")
            status = r.status + (f": {r.reason}" if r.reason else "")
            table.add_row(
                label,
                r.runs if not self.per_run else r.batch[-15:],
                it,
                fmt_num(r.tokens_per_s, ".0f"),
                fmt_bytes(r.mem_peak),
                fmt_num(r.final_loss, ".5g"),
                "base" if is_base else ("-" if delta is None else f"{delta:+.3g}"),
                Text(status[:60], style="red" if "fail" in status or "kill" in status else ""),
                "base" if is_base and not self.per_run else self._ratio_text(r),
            )
        sort_title, _ = COLUMNS[self.sort_col]
        if res is None:
            info = Text("")
        elif not res.experiments:
            info = Text(f"no experiments in MLflow yet ({res.tracking_uri}); finished runs show up here", style="dim")
        else:
            n = len(res.runs)
            info = Text.assemble(
                (f"{res.experiment}", "bold"),
                f"  {n} runs, {len(res.conditions)} conditions",
                ("  baseline ", "dim"), self.baseline or "-",
                ("  sort ", "dim"), sort_title + (" ↓" if self.sort_reverse else " ↑"),
                ("  filter ", "dim") if self.filter_text else "", self.filter_text,
            )
        self.query_one("#results-info", Static).update(info)

    def _ratio_text(self, r: Any) -> Text:
        ri = self._ratio(r)
        if ri is None or ri.ratio is None:
            return Text("-")
        if not ri.bounded:
            return Text(f"{ri.ratio:.3f} too few repeats" if "too few" in ri.note else f"{ri.ratio:.3f} unbounded",
                        style="yellow")
        style = "green" if ri.high < 1 else "red" if ri.low > 1 else ""  # type: ignore[operator]
        return Text(f"{ri.ratio:.3f} {fmt_interval(ri.low, ri.high)}", style=style)

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
        self.export(self.experiment, out, self.batch, self._baseline_condition())

    def _baseline_condition(self) -> str | None:
        if self.results is None or not self.baseline:
            return None
        for c in self.results.conditions:
            if c.label == self.baseline:
                return c.label
        return None

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
        from dstui.core import paths
        from dstui.tracking import client as tracking

        argv = tracking.run_ui_command(paths.tracking_uri())
        body = (
            f"{shlex.join(argv)}\n\n"
            "over SSH: ssh -L 5000:127.0.0.1:5000 <this host>, then open http://127.0.0.1:5000\n"
            "(`dstui ui --start` runs it)"
        )
        self.app.push_screen(TextScreen("MLflow UI for these runs", body))
