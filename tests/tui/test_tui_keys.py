"""Issue 38.6 in the TUI: `l` asks before launching a batch, Escape leaves a text field, an lr axis has a
column in Compose's run list."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input
from tui_helpers import REPO, home_shown, open_compose, seed_spec, wait_for

from dstui.core.rundir import list_batches
from dstui.tui.app import DstuiApp
from dstui.tui.screens.confirm import ConfirmScreen
from dstui.tui.screens.runs import RunsScreen

pytestmark = pytest.mark.anyio


async def test_l_asks_before_launching_and_no_launches_nothing(tui_env: Path) -> None:
    spec = seed_spec(tui_env, name="asked", steps=3)
    app = DstuiApp(spec_path=spec, supervise=False, watch_s=0.3)
    async with app.run_test(size=(120, 36)) as pilot:
        assert await home_shown(pilot)
        await pilot.press("l")
        assert await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), timeout=60)
        question = app.screen.question
        assert question.startswith("Launch 1 run(s) of asked from asked.yaml?") and "echo-r0" in question
        await pilot.press("n")
        await pilot.pause(0.5)
        assert isinstance(app.screen, RunsScreen) and list_batches(tui_env / "runs") == []
        assert any(n.message == "not launched" for n in app._notifications)


def app_on(tui_env: Path, shipped: str) -> DstuiApp:
    """The app on a copy of one of dstui's specs (the shipped ones are read-only in Compose)."""
    spec = tui_env / shipped
    shutil.copy(REPO / "configs/experiments" / shipped, spec)
    return DstuiApp(spec_path=spec, supervise=False, watch_s=0.3)


async def test_escape_leaves_a_text_field_and_the_keys_work_again(tui_env: Path) -> None:
    app = app_on(tui_env, "smoke.yaml")
    async with app.run_test(size=(120, 36)) as pilot:
        screen = await open_compose(pilot)
        steps = screen.query_one("#in-steps", Input)
        steps.focus()
        await pilot.pause()
        await pilot.press("2")  # in the field: a digit typed, no screen switch
        await pilot.pause()
        assert app.focused is steps and app.current_mode == "compose" and steps.value.endswith("2")
        await pilot.press("backspace", "escape")
        await pilot.pause()
        assert app.focused is None
        await pilot.press("2")  # now the app's key: the Runs screen
        assert await wait_for(pilot, lambda: app.current_mode == "runs", timeout=10)


async def test_compose_shows_an_lr_axis_in_a_column(tui_env: Path) -> None:
    app = app_on(tui_env, "lrsweep.yaml")
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_compose(pilot)
        table = screen.query_one("#runlist", DataTable)
        assert await wait_for(pilot, lambda: table.row_count == 4, timeout=30)
        labels = [str(c.label) for c in table.ordered_columns]
        assert labels[:5] == ["#", "run", "mem/GPU", "step", "lr"], labels  # right of the step time: on screen at 100 columns
        assert [str(table.get_cell_at((i, 4))) for i in range(4)] == ["0.0001", "0.001", "0.0001", "0.001"]
        assert all("lr=" not in str(table.get_cell_at((i, len(labels) - 1))) for i in range(4))  # not twice
