"""The runs screen's body: the batches, the runs of the highlighted one, where its time went.

It only reads run folders (status.json, batch.json) and shows them; what the
keys do to runs (launch, cancel, retry, take over) is the screen's, through
:mod:`dstui.tui.run_control`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from dstui.core import paths
from dstui.core.rundir import BatchDir, RunDir, list_batches
from dstui.core.terminal import printable
from dstui.tui import run_control
from dstui.tui.runs_cells import BATCH_COLUMNS, RUN_COLUMNS, batch_cells, run_cells
from dstui.tui.widgets.bisect_progress import BisectProgress
from dstui.tui.widgets.cached_table import CachedTable
from dstui.tui.widgets.time_bar import TimeBar

BATCHES_EVERY_S = 5.0  # the batch list changes rarely; the runs of the shown batch every tick


class BatchBrowser(Vertical):
    """Batches (top), the highlighted batch's runs, and the time bar of the highlighted run."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batch: BatchDir | None = None
        self.marked: set[str] = set()
        self.live: dict[str, bool] = {}
        self.statuses: list[dict] = []
        self._last_batches = 0.0
        self._spec: Path | None = None
        self._refusal: tuple[Path, str] | None = None  # (spec, why its launch was refused)

    def compose(self) -> ComposeResult:
        yield Static(id="spec-line")
        yield BisectProgress(id="bisect")
        yield CachedTable(id="batches", cursor_type="row", zebra_stripes=False)
        yield CachedTable(id="runs", cursor_type="row")
        yield TimeBar(id="run-times")

    def setup(self) -> None:
        """Columns and a first read (the screen calls it from its on_mount, before anything else)."""
        self.query_one("#batches", CachedTable).add_columns(*BATCH_COLUMNS)
        self.runs_table.add_columns(*RUN_COLUMNS)
        self.query_one(TimeBar).display = False

    @property
    def runs_table(self) -> CachedTable:
        return self.query_one("#runs", CachedTable)

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

    # -- reading the folders -------------------------------------------------

    def tick(self) -> None:
        self.query_one(BisectProgress).refresh_from(paths.runs_dir())
        self.refresh_batches()
        self.refresh_runs()

    def refresh_batches(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_batches < BATCHES_EVERY_S:
            return
        self._last_batches = now
        batches = list_batches(paths.runs_dir())[: run_control.MAX_BATCHES]
        self.live = {b.id: run_control.supervised(b) for b in batches}
        table = self.query_one("#batches", CachedTable)
        keep = self.batch.id if self.batch else None
        if table.sync((b.id, batch_cells(b, self.live.get(b.id, False))) for b in batches):
            if keep in table.cells:
                table.move_to(keep)
            elif batches:
                self.batch = batches[0]
        if self.batch is None and batches:
            self.batch = batches[0]

    def refresh_runs(self) -> None:
        runs = self.batch.runs() if self.batch else []
        self.statuses = [{"name": rd.name, **rd.status()} for rd in runs]
        self.runs_table.sync((st["name"], run_cells(st, st["name"] in self.marked)) for st in self.statuses)
        self._show_times()

    def _show_times(self) -> None:
        self.query_one(TimeBar).show(self.runs_table.cursor_key(), self.statuses)

    def select_batch(self, batch_id: str) -> None:
        b = BatchDir(paths.runs_dir() / batch_id)
        if not b.batch_file.exists():
            return
        self.refresh_batches(force=True)
        self.batch = b
        self.marked.clear()
        self.query_one("#batches", CachedTable).move_to(batch_id)
        self.refresh_runs()

    @on(DataTable.RowHighlighted, "#batches")
    def _batch_highlighted(self, event: DataTable.RowHighlighted) -> None:
        key = event.row_key.value if event.row_key else None
        if key and (self.batch is None or self.batch.id != key):
            self.batch = BatchDir(paths.runs_dir() / key)
            self.marked.clear()
            self.refresh_runs()

    @on(DataTable.RowHighlighted, "#runs")
    def _run_highlighted(self) -> None:
        self._show_times()

    @on(DataTable.RowSelected, "#batches")
    def _batch_selected(self) -> None:
        self.runs_table.focus()

    # -- selection -----------------------------------------------------------

    def current_run(self) -> RunDir | None:
        key = self.runs_table.cursor_key()
        return RunDir(self.batch.path / key) if key and self.batch is not None else None

    def mark(self) -> None:
        """Mark or unmark the run under the cursor, then move down."""
        rd = self.current_run()
        if rd is None:
            return
        self.marked.symmetric_difference_update({rd.name})
        self.refresh_runs()
        self.runs_table.action_cursor_down()

    def mark_all(self) -> None:
        names = set(self.runs_table.cells)
        self.marked = set() if self.marked >= names else names
        self.refresh_runs()
