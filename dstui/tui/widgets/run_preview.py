"""The compose screen's right side: the runs a spec expands to, its errors, the DeepSpeed check
the memory forecast per GPU and the predicted step time of each run.

The run list follows every keystroke (expansion is cheap); the DeepSpeed check
and the forecast come later from a worker (dstui/tui/compose_check.py), so
the forecast cells read '…' until then.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from dstui.spec.experiment import ExperimentSpec, RunSpec
from dstui.tui import compose_model as cm
from dstui.tui.compose_check import CheckResult
from dstui.usecases import varying_settings

MEMORY = "mem/GPU"
STEP = "step"  # the predicted time per optimizer step
PENDING = Text("…", style="dim")
SHOWN_WHY = 3  # runs whose reason is spelt out above the list; the rest are marked in it


class RunPreview(Vertical):
    """Count, error, DeepSpeed check, forecast note and the run list of the spec being edited."""

    def compose(self) -> ComposeResult:
        yield Static(id="count")
        yield Static(id="blocked")
        yield Static(id="error")
        yield Static(id="dsvalid")
        yield Static(id="memnote")
        yield DataTable(id="runlist", cursor_type="row", zebra_stripes=True)

    columns: tuple[str, ...] = ()

    def setup(self) -> None:
        self._set_columns(cm.preview_columns(()))

    def _set_columns(self, columns: tuple[str, ...]) -> None:
        """The run list's columns: the fixed ones, and a column for each setting that varies beyond them."""
        table = self.query_one("#runlist", DataTable)
        table.clear(columns=True)
        for title in columns:
            table.add_column(title, key=title)
        self.columns = columns

    def show_runs(self, spec: ExperimentSpec | None, runs: list[RunSpec]) -> None:
        table = self.query_one("#runlist", DataTable)
        varying = varying_settings.varying(runs)
        if cm.preview_columns(varying) != self.columns:
            self._set_columns(cm.preview_columns(varying))
        table.clear()
        mem, step = self.columns.index(MEMORY), self.columns.index(STEP)
        for r, row in zip(runs, cm.preview_rows(runs, varying), strict=True):
            cells: list = list(row)
            cells[mem] = cells[step] = PENDING
            table.add_row(*cells, key=r.name)
        count = self.query_one("#count", Static)
        if spec is not None:
            n_cond = len({r.condition for r in runs})
            n_rev = max(1, len(spec.revisions))
            count.update(
                Text.assemble(
                    (f"{len(runs)} runs", "bold"),
                    f" = {n_cond} conditions × {n_rev} revision{'s' if n_rev > 1 else ''}"
                    f" × {spec.repeats} repeat{'s' if spec.repeats > 1 else ''}",
                )
            )
        else:
            count.update(Text("0 runs", style="bold"))

    def show_blocked(self, blocked: bool) -> None:
        """Say that the run list is not what a launch would run while a field is marked ✗.

        The list stays (it is the spec before the ✗ edit, useful while typing), but its count
        must not read as the runs the form shows.
        """
        note = self.query_one("#blocked", Static)
        note.update(Text("✗ not these runs: the list is from before the ✗ field; save and launch wait for it", style="bold red") if blocked else "")
        note.display = blocked

    def show_error(self, text: str | None) -> None:
        box = self.query_one("#error", Static)
        box.update(Text(f"✗ {text}", style="bold red") if text else "")
        box.display = bool(text)

    def check_pending(self, any_runs: bool) -> None:
        self.query_one("#dsvalid", Static).update(Text("DeepSpeed check: pending…", style="dim") if any_runs else "")
        if not any_runs:
            self.query_one("#memnote", Static).update("")

    def show_check(self, result: CheckResult) -> None:
        dsv = self.query_one("#dsvalid", Static)
        if result.error:
            shown = Text(f"✗ {result.error}", style="bold red")
        elif result.note:
            shown = Text(result.note, style="yellow")
        else:
            shown = Text("✓ DeepSpeed configs valid", style="green")
        if result.infeasible:  # what `dstui run` would refuse: said here, and the rows marked
            n = len(result.infeasible)
            shown = Text.assemble(
                shown, "\n",
                (f"✗ {n} run{'s' if n != 1 else ''} cannot work on this machine ({result.machine}); "
                 "launching asks first:", "bold red"),
                *(f"\n  {name}: {why}" for name, why in list(result.infeasible.items())[:SHOWN_WHY]),
                f"\n  … and {n - SHOWN_WHY} more (marked ✗)" if n > SHOWN_WHY else "",
            )  # fmt: skip
        dsv.update(shown)
        table = self.query_one("#runlist", DataTable)
        for name in list(table.rows):
            if str(name.value) in result.infeasible:
                table.update_cell(name, "run", Text(f"✗ {name.value}", style="bold red"), update_width=True)
        for name in list(table.rows):
            table.update_cell(name, MEMORY, result.memory.get(str(name.value), Text("-")), update_width=True)
            table.update_cell(name, STEP, result.step_time.get(str(name.value), Text("-")), update_width=True)
        # the table widens the column when it next goes idle; a direct call posts it nothing, so
        # without a prompt the new width could wait for an unrelated event (a key, a resize)
        table.check_idle()
        self.query_one("#memnote", Static).update(Text("\n".join(n for n in (result.memory_note, result.time_note) if n), style="dim"))
