"""The runs screen's body: the batches, the runs of the highlighted one, where its time went.

It renders the app's snapshots of the runs home (:mod:`dstui.tui.home_snapshot`)
and reads no file itself: what it shows is only ever what the newest snapshot
holds. What the keys do to runs (launch, cancel, retry) is the screen's, through
:mod:`dstui.tui.run_control`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from dstui.core.rundir import RunDir
from dstui.core.terminal import printable
from dstui.tui.home_snapshot import BatchView, HomeSnapshot, RunView
from dstui.tui.runs_cells import BATCH_COLUMNS, RUN_COLUMNS, batch_cells, run_cells
from dstui.tui.widgets.bisect_progress import BisectProgress
from dstui.tui.widgets.cached_table import CachedTable
from dstui.tui.widgets.time_bar import TimeBar


class BatchBrowser(Vertical):
    """Batches (top), the highlighted batch's runs, and the time bar of the highlighted run."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.home: HomeSnapshot | None = None
        self.batch_id: str | None = None  # the highlighted batch (kept while a snapshot lacks it)
        self.wanted: str | None = None  # a batch to highlight once a snapshot holds it (just launched)
        self.marked: set[str] = set()
        self._spec: Path | None = None
        self._refusal: tuple[Path, str] | None = None  # (spec, why its launch was refused)

    def compose(self) -> ComposeResult:
        yield Static(id="spec-line")
        yield BisectProgress(id="bisect")
        yield CachedTable(BATCH_COLUMNS, id="batches", cursor_type="row", zebra_stripes=False)
        yield CachedTable(RUN_COLUMNS, id="runs", cursor_type="row")
        yield TimeBar(id="run-times")

    def on_mount(self) -> None:
        self.query_one(TimeBar).display = False

    @property
    def runs_table(self) -> CachedTable:
        return self.query_one("#runs", CachedTable)

    @property
    def batches_table(self) -> CachedTable:
        return self.query_one("#batches", CachedTable)

    @property
    def view(self) -> BatchView | None:
        """The highlighted batch as the newest snapshot has it."""
        return self.home.batch(self.batch_id) if self.home is not None else None

    def show_spec(self, spec: Path | None) -> None:
        line = self.query_one("#spec-line", Static)
        self._spec = spec
        if spec:
            try:
                shown = Path(spec).relative_to(Path.cwd())
            except ValueError:
                shown = spec
            refused = self._refusal[1] if self._refusal and self._refusal[0] == Path(spec) else None
            # the refusal quotes the spec (untrusted): printable, one line, never markup (a Text)
            tail = ("  ✗ not launched: " + printable(refused, one_line=True), "bold red") if refused else ("  l launches it", "dim")
            line.update(Text.assemble(("spec ", "dim"), str(shown), tail))
        else:
            line.update(Text("no spec open: 1 composes or opens one (ctrl+p: Open spec ...)", style="dim"))

    def show_refusal(self, spec: Path | None, text: str | None) -> None:
        """Why the last launch of ``spec`` was refused (`dstui run`'s line), beside the spec; None clears it."""
        self._refusal = (Path(spec), text) if spec is not None and text else None
        if spec is not None and text and self._spec is None:
            self._spec = spec
        self.show_spec(self._spec)

    # -- rendering a snapshot ---------------------------------------------------

    def show(self, home: HomeSnapshot) -> None:
        """Render a snapshot: the bisect line, the batches, the highlighted batch's runs."""
        self.home = home
        self.query_one(BisectProgress).show(home.bisects)
        table = self.batches_table
        rebuilt = table.sync((b.id, batch_cells(b)) for b in home.batches)
        if self.wanted is not None and home.batch(self.wanted) is not None:
            self.wanted, self.batch_id = None, self.wanted
            self.marked.clear()
            rebuilt = True
        if self.batch_id is None or (rebuilt and home.batch(self.batch_id) is None):
            self.batch_id = home.batches[0].id if home.batches else None  # the newest (or the highlighted one is gone)
        if rebuilt and self.batch_id is not None:
            table.move_to(self.batch_id)
        self._show_runs()

    def _show_runs(self) -> None:
        view = self.view
        runs = view.runs if view is not None else ()
        self.runs_table.sync((r.name, run_cells(r, r.name in self.marked)) for r in runs)
        self._show_times()

    def _show_times(self) -> None:
        view = self.view
        statuses = [{**r.status, "name": r.name} for r in view.runs] if view is not None else []
        self.query_one(TimeBar).show(self.runs_table.cursor_key(), statuses)

    def select_batch(self, batch_id: str) -> None:
        """Highlight a batch: now when the snapshot holds it, else once one does (a batch just launched)."""
        if self.home is None or self.home.batch(batch_id) is None:
            self.wanted = batch_id
            return
        self.batch_id = batch_id
        self.marked.clear()
        self.batches_table.move_to(batch_id)
        self._show_runs()

    @on(DataTable.RowHighlighted, "#batches")
    def _batch_highlighted(self, event: DataTable.RowHighlighted) -> None:
        key = event.row_key.value if event.row_key else None
        if key and key != self.batch_id:
            self.batch_id = key
            self.marked.clear()
            self._show_runs()

    @on(DataTable.RowHighlighted, "#runs")
    def _run_highlighted(self) -> None:
        self._show_times()

    @on(DataTable.RowSelected, "#batches")
    def _batch_selected(self) -> None:
        self.runs_table.focus()

    # -- selection -----------------------------------------------------------

    def current_run(self) -> RunView | None:
        """The run under the cursor, as the newest snapshot has it."""
        key = self.runs_table.cursor_key()
        view = self.view
        return view.run(key) if key and view is not None else None

    def current_dir(self) -> RunDir | None:
        run = self.current_run()
        return run.dir if run is not None else None

    def mark(self) -> None:
        """Mark or unmark the run under the cursor, then move down."""
        run = self.current_run()
        if run is None:
            return
        self.marked.symmetric_difference_update({run.name})
        self._show_runs()
        self.runs_table.action_cursor_down()

    def mark_all(self) -> None:
        names = set(self.runs_table.cells)
        self.marked = set() if self.marked >= names else names
        self._show_runs()
