"""Issue 26.1-26.2: spec files are the user's, and every part of a spec is editable in Compose.

Real files and a real app under Pilot: a save changes only the edited line, a launch never
writes the spec, dstui's own specs are read-only, Enter in the path field opens (save as is
ctrl+t), unsaved
edits are not lost by quitting or opening another spec without a question.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from helpers import HEAVY
from textual.widgets import Collapsible, DataTable, Input, OptionList, Static, TextArea
from tui_helpers import REPO, confirm_launch, open_compose, wait_for

from dstui.core import paths
from dstui.core.rundir import list_batches
from dstui.spec.loading import expand_file
from dstui.tui.app import DstuiApp
from dstui.tui.screens.compose import ComposeScreen
from dstui.tui.screens.confirm import ConfirmScreen

pytestmark = pytest.mark.anyio

COMMENTED = """\
# My ZeRO sweep: every comment here must survive a save.
name: mine   # the experiment
settings:
  model: tiny-llama      # a preset
  micro_batch: 2
  steps: 4   # short
  warmup_steps: 1
  torch_adam: true    # no JIT-built op

# the grid
axes:
  zero_stage: [0, 1]    # two stages
baseline: z0
# the end
"""


def changed(before: str, after: str) -> list[tuple[str, str]]:
    """(old, new) of each line that differs; both files must have the same number of lines."""
    a, b = before.splitlines(), after.splitlines()
    assert len(a) == len(b), after
    return [(x, y) for x, y in zip(a, b, strict=True) if x != y]


async def type_into(pilot, screen: ComposeScreen, wid: str, text: str) -> None:  # noqa: ANN001
    """Replace an Input's text by typing it, as a user does."""
    inp = screen.query_one(wid, Input)
    inp.focus()
    if wid == "#path":  # the path is not part of the spec: nothing to wait for but the keys
        inp.value = ""
        await pilot.press(*text)
        await pilot.pause()
        return
    if inp.value:
        before = screen.generation
        inp.value = ""
        await taken(pilot, screen, before)
    before = screen.generation
    await pilot.press(*text)
    await taken(pilot, screen, before + len(text) - 1)  # one edit per key


async def edit_text(pilot, screen: ComposeScreen, wid: str, text: str) -> None:  # noqa: ANN001
    """Replace a YAML text area's content with an edit (as typing or pasting does)."""
    area = screen.query_one(wid, TextArea)
    area.focus()
    area.select_all()
    before = screen.generation
    area.replace(text, area.selection.start, area.selection.end)
    await taken(pilot, screen, before)


async def taken(pilot, screen: ComposeScreen, before: int) -> None:  # noqa: ANN001
    """Wait until the screen has handled the edit: the widget's Changed and the form's message are two hops,
    and one idle pause is not always enough for both on a loaded CI box."""
    assert await wait_for(pilot, lambda: screen.generation > before, timeout=20, step=0.05), "edit never reached Compose"
    await pilot.pause()


@HEAVY
async def test_one_field_edited_and_saved_keeps_every_other_byte(tui_env) -> None:  # noqa: ANN001
    path = tui_env / "mine.yaml"
    path.write_text(COMMENTED)
    app = DstuiApp(spec_path=path, supervise=False)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_compose(pilot)
        assert not screen.dirty and not screen.read_only
        await type_into(pilot, screen, "#in-micro_batch", "3")
        assert screen.dirty
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert not screen.dirty
    after = path.read_text()
    assert changed(COMMENTED, after) == [("  micro_batch: 2", "  micro_batch: 3")]
    assert yaml.safe_load(after)["settings"]["micro_batch"] == 3


@HEAVY
async def test_a_shipped_spec_is_read_only_and_saved_only_as_a_copy(tui_env) -> None:  # noqa: ANN001
    shipped = paths.CONFIGS_DIR / "experiments" / "smoke.yaml"
    before = shipped.read_bytes()
    app = DstuiApp(supervise=False)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_compose(pilot)
        # picked from the list, as a user does
        files = screen.query_one("#files", OptionList)
        files.focus()
        files.highlighted = next(i for i, o in enumerate(files.options) if o.id == str(shipped))
        await pilot.press("enter")
        await pilot.pause()
        assert screen.path == shipped.resolve() and screen.read_only
        assert "read-only" in str(screen.query_one("#path-title", Static).render())
        screen.query_one("#ck-zero_stage-0").focus()  # drop ZeRO 0
        await pilot.press("space")
        await pilot.pause()
        # the baseline z0 is gone with it: said, the runs still listed, the launch blocked
        assert screen.dirty and len(screen.runs) == 3
        assert "field 'baseline': 'z0' is not a condition of this spec" in (screen.launch_blocker() or "")
        await type_into(pilot, screen, "#baseline", "z1")
        assert screen.launch_blocker() is None and len(screen.runs) == 3
        screen.query_one("#ck-zero_stage-0").focus()
        await pilot.press("ctrl+s")  # refused: asks for a new path instead
        await pilot.pause()
        assert shipped.read_bytes() == before
        path_in = screen.query_one("#path", Input)
        assert app.focused is path_in and Path(path_in.value).resolve() == tui_env / "smoke.yaml"
        # Enter on the shipped path itself is refused too
        path_in.value = str(shipped)
        await pilot.press("enter")
        await pilot.pause()
        assert shipped.read_bytes() == before and screen.read_only
        # Enter on a path of the user's: the edits go there, and that file is what is edited now
        path_in.value = "mine/smoke.yaml"
        await pilot.press("enter")
        await pilot.pause()
        assert screen.path == tui_env / "mine" / "smoke.yaml" and not screen.read_only and not screen.dirty
    assert shipped.read_bytes() == before
    copy = (tui_env / "mine" / "smoke.yaml").read_text()
    assert yaml.safe_load(copy)["axes"]["zero_stage"] == [1, 2, 3]
    # the shipped file's comments came along: only the edited lines differ
    assert changed(before.decode(), copy) == [("  zero_stage: [0, 1, 2, 3]", "  zero_stage: [1, 2, 3]"),
                                              ("baseline: z0", "baseline: z1")]  # fmt: skip


@HEAVY
async def test_quitting_with_unsaved_edits_asks_first(tui_env) -> None:  # noqa: ANN001
    path = tui_env / "mine.yaml"
    path.write_text(COMMENTED)
    app = DstuiApp(spec_path=path, supervise=False)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_compose(pilot)
        screen.query_one("#ck-zero_stage-2").focus()
        await pilot.press("space")
        await pilot.pause()
        assert screen.dirty
        await pilot.press("q")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen) and app.return_code is None
        await pilot.press("n")  # no: stay, edits kept
        await pilot.pause()
        assert app.screen is screen and screen.dirty and app.return_code is None
        # opening another spec asks as well
        other = tui_env / "other.yaml"
        other.write_text("name: other\nsettings: {steps: 4}\n")
        app.open_spec(other)
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        await pilot.pause()
        assert screen.path == path and screen.dirty
        await pilot.press("q")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await pilot.pause()
        assert app.return_code == 0  # quit only now
    assert path.read_text() == COMMENTED  # quitting never saves


@HEAVY
async def test_quitting_without_edits_does_not_ask(tui_env) -> None:  # noqa: ANN001
    path = tui_env / "mine.yaml"
    path.write_text(COMMENTED)
    app = DstuiApp(spec_path=path, supervise=False)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_compose(pilot)
        screen.query_one("#ck-zero_stage-2").focus()
        await pilot.press("space", "space")  # on and off again: nothing changed
        await pilot.pause()
        assert not screen.dirty
        await pilot.press("q")
        await pilot.pause()
        assert app.return_code == 0


@HEAVY
async def test_save_as_key_writes_there_and_asks_before_overwriting(tui_env) -> None:  # noqa: ANN001
    path = tui_env / "mine.yaml"
    path.write_text(COMMENTED)
    app = DstuiApp(spec_path=path, supervise=False)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_compose(pilot)
        await type_into(pilot, screen, "#in-steps", "6")
        await pilot.press("ctrl+t")  # save as: the path field, and its title says Enter writes
        await pilot.pause()
        assert app.focused is screen.query_one("#path", Input)
        assert "save as" in str(screen.query_one("#path-title", Static).render())
        await type_into(pilot, screen, "#path", "copy.yaml")
        await pilot.press("enter")
        await pilot.pause()
        assert screen.path == tui_env / "copy.yaml" and not screen.dirty
        assert path.read_text() == COMMENTED  # the file it came from is untouched
        assert changed(COMMENTED, (tui_env / "copy.yaml").read_text()) == [("  steps: 4   # short", "  steps: 6   # short")]
        # save as over an existing file asks first
        await type_into(pilot, screen, "#in-steps", "7")
        await pilot.press("ctrl+t")
        await type_into(pilot, screen, "#path", "mine.yaml")
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        await pilot.pause()
        assert path.read_text() == COMMENTED and screen.dirty
        await pilot.press("enter")  # back in the field, still saving as
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
        assert screen.path == path and not screen.dirty
    assert changed(COMMENTED, path.read_text()) == [("  steps: 4   # short", "  steps: 7   # short")]


@HEAVY
async def test_enter_after_ctrl_o_opens_and_never_overwrites(tui_env) -> None:  # noqa: ANN001
    """The review's case: an edit, ctrl+o, an existing path, Enter once asked to overwrite that file."""
    path = tui_env / "mine.yaml"
    path.write_text(COMMENTED)
    other = tui_env / "other.yaml"
    other_text = "name: other\nsettings: {steps: 4}\n"
    other.write_text(other_text)
    app = DstuiApp(spec_path=path, supervise=False)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_compose(pilot)
        await type_into(pilot, screen, "#in-steps", "6")
        assert screen.dirty
        title = str(screen.query_one("#path-title", Static).render())
        assert "Enter opens" in title and "ctrl+t saves as" in title
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert app.focused is screen.query_one("#path", Input)
        await type_into(pilot, screen, "#path", "other.yaml")
        await pilot.press("enter")
        await pilot.pause()
        question = app.screen
        assert isinstance(question, ConfirmScreen)
        text = str(question.query_one(Static).render())
        assert "Discard your edits and open other.yaml?" in text and "Overwrite" not in text
        await pilot.press("n")  # keep the edits: nothing opened, nothing written
        await pilot.pause()
        assert screen.path == path and screen.dirty and other.read_text() == other_text
        await pilot.press("enter")  # asked again; yes opens it
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await pilot.pause()
        assert screen.path == other and not screen.dirty and screen.data["name"] == "other"
        # without edits Enter opens at once; a path with no file starts a new spec named after it
        await pilot.press("ctrl+o")
        await type_into(pilot, screen, "#path", "mine.yaml")
        await pilot.press("enter")
        await pilot.pause()
        assert screen.path == path and screen.data["settings"]["steps"] == 4
        await pilot.press("ctrl+o")
        await type_into(pilot, screen, "#path", "fresh.yaml")
        await pilot.press("enter")
        await pilot.pause()
        assert screen.path == tui_env / "fresh.yaml" and screen.data["name"] == "fresh"
        assert not (tui_env / "fresh.yaml").exists()  # opening never writes
        # leaving the field puts the file being edited back in it
        await pilot.press("ctrl+o")
        await type_into(pilot, screen, "#path", "half-typed")
        screen.query_one("#in-steps", Input).focus()
        await pilot.pause()
        assert screen.query_one("#path", Input).value == "fresh.yaml" and screen.path_mode == "open"
    assert path.read_text() == COMMENTED and other.read_text() == other_text


@HEAVY
async def test_quitting_a_read_only_spec_offers_save_as(tui_env) -> None:  # noqa: ANN001
    """ctrl+s cannot write one of dstui's own specs: the quit question names the key that keeps the edits."""
    shipped = paths.CONFIGS_DIR / "experiments" / "smoke.yaml"
    app = DstuiApp(spec_path=shipped, supervise=False)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_compose(pilot)
        assert screen.read_only
        screen.query_one("#ck-dtype-1").focus()  # bf16 as well
        await pilot.press("space")
        await pilot.pause()
        assert screen.dirty
        await pilot.press("q")
        await pilot.pause()
        text = str(app.screen.query_one(Static).render())
        assert isinstance(app.screen, ConfirmScreen) and "ctrl+s" not in text
        assert "ctrl+t saves them under a new name first" in text
        await pilot.press("n")
        await pilot.pause()
        await pilot.press("ctrl+t")  # what it says works
        await pilot.pause()
        assert "save as" in str(screen.query_one("#path-title", Static).render())
        assert Path(screen.query_one("#path", Input).value).resolve() == tui_env / "smoke.yaml"


@HEAVY
async def test_exclusions_conditions_and_ds_overrides_edit_preview_and_file(tui_env) -> None:  # noqa: ANN001
    path = tui_env / "mine.yaml"
    path.write_text(COMMENTED)
    app = DstuiApp(spec_path=path, supervise=False)
    async with app.run_test(size=(120, 36)) as pilot:
        screen = await open_compose(pilot)
        table = screen.query_one("#runlist", DataTable)
        assert [r.name for r in screen.runs] == ["z0-r0", "z1-r0"]
        await edit_text(pilot, screen, "#tx-exclude", "- {zero_stage: 1}\n")
        assert [r.name for r in screen.runs] == ["z0-r0"]
        await edit_text(pilot, screen, "#tx-conditions", "- name: big\n  micro_batch: 8\n")
        assert [r.name for r in screen.runs] == ["z0-r0", "big-r0"]
        assert table.get_cell("big-r0", "mb") == "8"
        # ds_overrides: a text that does not read is shown and not used; saving is refused
        await edit_text(pilot, screen, "#tx-ds_overrides", "{zero_optimization: {reduce_bucket_size: 1000")
        assert "ds overrides: not valid YAML/JSON" in str(screen.query_one("#error", Static).render())
        assert "ds_overrides" not in screen.data["settings"]
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert path.read_text() == COMMENTED
        await edit_text(pilot, screen, "#tx-ds_overrides", '{"zero_optimization": {"reduce_bucket_size": 1000}}')
        assert not screen.invalid and screen.error is None
        assert "ds_overrides={zero_optimization" in str(table.get_cell("z0-r0", "other"))
        assert screen.runs[0].settings.ds_overrides == {"zero_optimization": {"reduce_bucket_size": 1000}}
        # a Settings field that is not in the main list: a toggle under "more settings"
        screen.query_one("#more", Collapsible).collapsed = False
        await pilot.pause()
        screen.query_one("#ck-deterministic-1").focus()
        await pilot.press("space")  # on as well as off: an axis
        await pilot.pause()
        assert [r.settings.deterministic for r in screen.runs] == [False, True, False]  # z0 x (off, on), big
        screen.query_one("#ck-deterministic-0").focus()
        await pilot.press("space")  # on only: a setting
        await pilot.pause()
        assert [r.settings.deterministic for r in screen.runs] == [True, True]
        await pilot.press("ctrl+s")
        await pilot.pause()
        ui = [(r.name, r.key) for r in screen.runs]
    saved = yaml.safe_load(path.read_text())
    assert saved["exclude"] == [{"zero_stage": 1}]
    assert saved["conditions"] == [{"name": "big", "micro_batch": 8}]
    assert saved["settings"]["ds_overrides"] == {"zero_optimization": {"reduce_bucket_size": 1000}}
    _, runs = expand_file(path)
    assert [(r.name, r.key) for r in runs] == ui
    for line in COMMENTED.splitlines():  # every line of the file is still there
        assert line in path.read_text().splitlines(), line


COMMAND_SPEC = """\
# A fast command spec: prints the seed's step lines.
name: cmdspec   # kept
settings:
  kind: command
  metrics_format: seed
  steps: 2
  warmup_steps: 1
conditions:
  - name: echo
    command: ["{python}", "-c", "print('Epoch 1, Step 1, Loss: 1.0 sync: True time: 0.01 alloc_mem: 1 peak_mem: 2'); print('Epoch 1, Step 2, Loss: 0.5 sync: True time: 0.01 alloc_mem: 1 peak_mem: 2')"]
"""


@pytest.mark.e2e  # starts supervisors in subprocesses
async def test_launching_never_writes_the_spec(tui_env) -> None:  # noqa: ANN001
    path = tui_env / "cmd.yaml"
    path.write_text(COMMAND_SPEC)
    stat0 = path.stat()
    app = DstuiApp(spec_path=path, supervise=False, watch_s=0.3)

    def batches() -> list:
        return [b for b in list_batches(paths.runs_dir()) if b.info().get("runs")]

    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_compose(pilot)
        await pilot.press("ctrl+r")  # unchanged: launches the file as it is
        await confirm_launch(pilot)
        assert await wait_for(pilot, lambda: len(batches()) == 1 and batches()[0].is_finished(), timeout=240)
        first = batches()[0]
        assert first.info()["spec_path"] == str(path)
        assert path.stat().st_mtime_ns == stat0.st_mtime_ns and path.read_text() == COMMAND_SPEC
        # edited and not saved: runs as edited, its text kept beside the batch, the file untouched
        await pilot.press("1")
        await pilot.pause()
        await type_into(pilot, screen, "#in-steps", "3")
        assert screen.dirty
        await pilot.press("ctrl+r")
        assert "(as edited in Compose, not saved)" in await confirm_launch(pilot)
        assert await wait_for(pilot, lambda: len(batches()) == 2 and all(b.is_finished() for b in batches()), timeout=240)
        second = next(b for b in batches() if b.id != first.id)
        assert screen.dirty  # launching is not saving
    assert path.stat().st_mtime_ns == stat0.st_mtime_ns and path.read_text() == COMMAND_SPEC
    info = second.info()
    copy = second.path / "spec.yaml"
    assert info["spec_path"] == str(copy) and info["edited_from"] == str(path)
    assert changed(COMMAND_SPEC, copy.read_text()) == [("  steps: 2", "  steps: 3")]
    assert [rd.status()["steps_total"] for rd in second.runs()] == [3]


def test_shipped_list_and_checkout_agree() -> None:
    """The specs Compose lists are the ones it treats as shipped (read-only)."""
    from dstui.spec.loading import is_shipped
    from dstui.tui import compose_model as cm

    files = cm.experiment_files()
    assert files and all(is_shipped(f) for f in files)
    assert (REPO / "configs" / "experiments" / "smoke.yaml").resolve() in [f.resolve() for f in files]
    assert not is_shipped(shutil.which("python") or "/usr/bin/python")
