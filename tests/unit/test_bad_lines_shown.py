"""A run's bad metric lines are shown where a user looks: `dstui status` and the TUI's runs table (#33.1)."""

from __future__ import annotations

from pathlib import Path

from dstui.commands.status import time_lines
from dstui.core.records import bad_lines_note
from dstui.core.rundir import RunDir, merge_status
from dstui.tui.home_snapshot import RunView
from dstui.tui.runs_cells import run_cells
from dstui.usecases import run_figures


def test_bad_lines_reach_status_and_the_runs_table(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "r0")
    rd.path.mkdir()
    st = merge_status(rd, dict(name="r0", state="running", bad_lines=2, first_bad_line="not a number: Epoch 1, Step 3, Loss: abc"))
    assert bad_lines_note(st) == "2 bad lines (first: not a number: Epoch 1, Step 3, Loss: abc)"
    assert "  bad   r0: 2 bad lines (first: not a number: Epoch 1, Step 3, Loss: abc)" in time_lines([rd])

    def view(status: dict) -> RunView:  # the run as the TUI's snapshot holds it
        return RunView(rd.name, rd.path, status, 0, run_figures.speed(status))

    assert str(run_cells(view(st), marked=False)[-1]).startswith("2 bad lines (first: not a number")
    assert bad_lines_note({"bad_lines": 0}) is None and str(run_cells(view({**st, "reason": "exit code 1"}), False)[-1]) == "exit code 1"
