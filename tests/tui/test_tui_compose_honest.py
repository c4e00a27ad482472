"""Compose shows what it would run: no silent fallback from what a field shows to what a launch uses.

A new-user review found three ways the form and the run list disagreed (every box of a choice
row unchecked ran the default; an emptied field ran the default unseen; a field that does not
read left the old value in the runs). Now a row with nothing checked and a field that does not
read are marked ✗, the run list says it is not what would run, and save and launch (ctrl+r in
Compose, l in Runs) are refused with the reason; an emptied field shows the default it uses.
Also here: `dstui tui` with a spec path that does not exist says so, and the help reflows.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from helpers import HEAVY
from textual.widgets import DataTable, Input, Static
from tui_helpers import open_compose, wait_for

from dstui.core import paths
from dstui.core.errors import DstuiError
from dstui.core.rundir import list_batches
from dstui.tui.app import DstuiApp
from dstui.tui.screens.compose import ComposeScreen
from dstui.tui.screens.help import HelpScreen

pytestmark = pytest.mark.anyio

SPEC = """\
name: mine
settings:
  model: tiny-llama
  micro_batch: 2
  steps: 4
axes:
  zero_stage: [0, 1]
"""


@contextlib.asynccontextmanager
async def composing(tui_env) -> AsyncIterator[tuple[DstuiApp, Any, ComposeScreen]]:  # noqa: ANN001
    """The app at 120x36 on a copy of SPEC, Compose open: (app, pilot, screen)."""
    path = tui_env / "mine.yaml"
    path.write_text(SPEC)
    app = DstuiApp(spec_path=path, supervise=False)
    async with app.run_test(size=(120, 36)) as pilot:
        yield app, pilot, await open_compose(pilot)


async def toggle(pilot, screen: ComposeScreen, box: str) -> None:  # noqa: ANN001
    screen.query_one(box).focus()
    await pilot.press("space")
    await pilot.pause()


def shown(screen: ComposeScreen, wid: str) -> str:
    return str(screen.query_one(wid, Static).render())


def refused(app: DstuiApp, why: str) -> bool:
    return any("not launched" in n.message and why in n.message for n in app._notifications)


@pytest.mark.parametrize("row", ["zero_stage", "dtype"])
@HEAVY
async def test_a_choice_row_with_nothing_checked_is_marked_and_blocks(tui_env, row) -> None:  # noqa: ANN001
    async with composing(tui_env) as (app, pilot, screen):
        boxes = [f"#ck-{row}-0", f"#ck-{row}-1"] if row == "zero_stage" else [f"#ck-{row}-0"]
        for box in boxes:
            await toggle(pilot, screen, box)
        label = "ZeRO stage" if row == "zero_stage" else "dtype"
        assert f"{label}: nothing checked" in shown(screen, "#error")
        assert "not these runs" in shown(screen, "#blocked") and screen.query_one("#blocked").display
        assert screen.query_one(f"#ck-{row}-0").parent.has_class("-bad")
        # neither saved nor launched, from Compose or from Runs
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert (tui_env / "mine.yaml").read_text() == SPEC
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert app.screen is screen and refused(app, "nothing checked")
        await pilot.press("2")
        await pilot.pause()
        app._notifications.clear()
        await pilot.press("l")
        await pilot.pause()
        assert refused(app, "nothing checked") and not list_batches(paths.runs_dir())
        await pilot.press("1")
        await pilot.pause()
        # one value checked again: the row is a value again, the mark and the note go
        await toggle(pilot, screen, f"#ck-{row}-2")
        assert not screen.invalid and not screen.query_one("#blocked").display
        assert not screen.query(".-bad")
        want = {"zero_stage": "z2", "dtype": "fp16"}[row]
        cells = screen.query_one("#runlist", DataTable)
        column = "zero" if row == "zero_stage" else "dtype"
        assert {str(cells.get_cell(r.name, column)) for r in screen.runs} == {want}


@HEAVY
async def test_an_emptied_field_shows_the_default_it_uses(tui_env) -> None:  # noqa: ANN001
    async with composing(tui_env) as (app, pilot, screen):
        mb = screen.query_one("#in-micro_batch", Input)
        assert mb.value == "2"
        before = screen.generation
        mb.value = ""
        assert await wait_for(pilot, lambda: screen.generation > before, timeout=20, step=0.05)
        await pilot.pause()
        assert mb.placeholder == "1 (default)"  # what the runs use, shown where the value was
        assert {r.settings.micro_batch for r in screen.runs} == {1} and not screen.invalid


@HEAVY
async def test_a_field_that_does_not_read_blocks_launch_with_its_reason(tui_env) -> None:  # noqa: ANN001
    async with composing(tui_env) as (app, pilot, screen):
        mb = screen.query_one("#in-micro_batch", Input)
        mb.focus()
        mb.value = ""
        await pilot.press("t", "w", "o")
        await pilot.pause()
        why = "micro batch: 'two' is not a whole number"
        assert screen.invalid == {"in-micro_batch": why}
        assert why in shown(screen, "#error") and "not these runs" in shown(screen, "#blocked")
        assert mb.has_class("-bad")
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert app.screen is screen and refused(app, why)
        await pilot.press("2")
        await pilot.pause()
        await pilot.press("l")
        await pilot.pause()
        assert not list_batches(paths.runs_dir())
        await pilot.press("1")
        await pilot.pause()
        mb.focus()
        mb.value = "3"
        assert await wait_for(pilot, lambda: not screen.invalid, timeout=20, step=0.05)
        await pilot.pause()
        assert not mb.has_class("-bad") and not screen.query_one("#blocked").display
        assert {r.settings.micro_batch for r in screen.runs} == {3}


@HEAVY
async def test_the_unsaved_edits_question_names_no_save_key_while_a_field_is_marked(tui_env) -> None:  # noqa: ANN001
    """ctrl+s is refused while a field is ✗: the question must not offer it."""
    from dstui.tui.screens.confirm import ConfirmScreen

    async with composing(tui_env) as (app, pilot, screen):
        screen.query_one("#ck-dtype-1").focus()  # a valid edit: bf16 as well
        await pilot.press("space")
        assert await wait_for(pilot, lambda: screen.dirty, timeout=20, step=0.05)
        mb = screen.query_one("#in-micro_batch", Input)
        mb.focus()
        mb.value = ""
        await pilot.press("t", "w", "o")
        assert await wait_for(pilot, lambda: bool(screen.invalid), timeout=20, step=0.05)
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        text = str(app.screen.query_one(Static).render())
        assert "ctrl+s" not in text and "must be fixed before they can be saved" in text


async def test_a_spec_path_that_does_not_exist_is_said_at_start(tui_env) -> None:  # noqa: ANN001
    app = DstuiApp(spec_path=tui_env / "nope.yaml", supervise=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        notes = [n for n in app._notifications if "nope.yaml" in n.message]
        assert notes and "does not exist" in notes[0].message and notes[0].severity == "warning"


def test_a_folder_as_the_spec_is_refused_before_the_screen_starts(tui_env) -> None:  # noqa: ANN001
    from dstui.commands import tui

    with pytest.raises(DstuiError, match="a folder, not a spec file"):
        tui.run(argparse.Namespace(spec=str(tui_env), batch=None, live=False, parallel=0))


@pytest.mark.parametrize("mode", ["compose", "runs", "results"])
@HEAVY
async def test_help_text_reflows_instead_of_breaking_mid_sentence(tui_env, mode) -> None:  # noqa: ANN001
    """The help is wrapped by its widget: a line break in the text is a paragraph end, never a wrap."""
    app = DstuiApp(supervise=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press({"compose": "1", "runs": "2", "results": "3"}[mode])
        await pilot.pause()
        under = app.screen
        for paragraph in under.HELP.split("\n"):
            assert paragraph.rstrip()[-1] in ".:)", paragraph  # a whole paragraph, not half a sentence
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        if mode == "results":
            assert "any param/tag as key=value" in under.HELP  # the review's "as / key=value"


def test_every_screen_help_is_whole_paragraphs() -> None:
    from dstui.tui.screens import live, log, results, results_chart, runs

    for screen in (live.LiveScreen, log.LogScreen, results.ResultsScreen, results_chart.ResultsChartScreen,
                   runs.RunsScreen, ComposeScreen):  # fmt: skip
        for paragraph in screen.HELP.split("\n"):
            assert paragraph.rstrip()[-1] in ".:)", (screen.__name__, paragraph)
