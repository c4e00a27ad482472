"""The compose screen's revision editor: add, edit, remove revisions under Pilot; saved spec and `dstui list` agree."""

from __future__ import annotations

import shutil

import pytest
import yaml
from helpers import HEAVY, git_at
from test_tui_compose import listed
from textual.widgets import DataTable, Input, Static
from tui_helpers import REPO

from dstui.tui import compose_model as cm
from dstui.tui.app import DstuiApp
from dstui.tui.screens.revisions import RevisionEditor

pytestmark = pytest.mark.anyio


async def _type(pilot, screen, field: str, text: str) -> None:  # noqa: ANN001
    inp = screen.query_one(f"#rev-{field}", Input)
    inp.focus()
    inp.value = ""
    await pilot.press(*text)


async def _save_as(pilot, compose, out) -> list[tuple[str, str]]:  # noqa: ANN001
    """Save the composed spec to ``out`` (save as: ctrl+t, the path, Enter); the runs the screen shows."""
    await pilot.press("ctrl+t")
    compose.query_one("#path", Input).value = str(out)
    await pilot.press("enter")
    await pilot.pause()
    return [(r.name, r.key) for r in compose.runs]


@HEAVY
async def test_add_edit_remove_revisions(tui_env):
    spec = tui_env / "smoke.yaml"
    shutil.copy(REPO / "configs/experiments/smoke.yaml", spec)
    app = DstuiApp(spec_path=spec, supervise=False)
    async with app.run_test(size=(110, 36)) as pilot:
        await pilot.press("1")
        compose = app.screen
        assert len(compose.runs) == 4
        await pilot.press("ctrl+e")
        await pilot.pause()
        editor = app.screen
        assert isinstance(editor, RevisionEditor)
        # add two revisions: a PyPI release and the installed DeepSpeed
        for name, source, value in (("stable", "pypi", "0.18.0"), ("base", "installed", "")):
            await _type(pilot, editor, "name", name)
            await _type(pilot, editor, "source", source)
            await _type(pilot, editor, "value", value)
            await pilot.click("#rev-save")
            await pilot.pause()
        assert [r["name"] for r in editor.data["revisions"]] == ["stable", "base"]
        # a wrong one is refused with the spec model's reason, nothing saved
        await _type(pilot, editor, "name", "bad")
        await _type(pilot, editor, "source", "git")
        await _type(pilot, editor, "value", "/tmp/ds")
        await pilot.click("#rev-save")
        await pilot.pause()
        assert "'git' needs 'ref'" in str(editor.query_one("#rev-error", Static).render())
        assert len(editor.data["revisions"]) == 2
        # edit 'stable' (row 0): another version
        table = editor.query_one("#rev-table", DataTable)
        table.focus()
        table.move_cursor(row=0)
        await pilot.press("enter")
        await pilot.pause()
        assert editor.editing == 0 and editor.query_one("#rev-value", Input).value == "0.18.0"
        await _type(pilot, editor, "value", "0.17.1")
        await pilot.click("#rev-save")
        await pilot.pause()
        assert editor.data["revisions"][0] == {"name": "stable", "pypi": "0.17.1"}
        # add a third and remove it again
        await _type(pilot, editor, "name", "tmp")
        await _type(pilot, editor, "source", "path")
        await _type(pilot, editor, "value", "/tmp/tree")
        await pilot.click("#rev-save")
        await pilot.pause()
        table.focus()
        table.move_cursor(row=2)
        await pilot.press("enter")
        await pilot.press("ctrl+d")
        await pilot.pause()
        assert [r["name"] for r in editor.data["revisions"]] == ["stable", "base"]
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is compose
        assert len(compose.runs) == 8  # 4 conditions x 2 revisions
        assert "stable: pypi=0.17.1" in str(compose.query_one("#revisions", Static).render())
        out = tui_env / "revs.yaml"
        ui = await _save_as(pilot, compose, out)
    saved = yaml.safe_load(out.read_text())
    assert saved["revisions"] == [{"name": "stable", "pypi": "0.17.1"}, {"name": "base", "installed": True}]
    assert listed(out) == ui


@HEAVY
async def test_an_edit_keeps_the_revisions_install_and_the_editor_sets_one(tui_env):
    """`install` (how a git revision's env is built) has its field: an edit of another field keeps it."""
    repo = tui_env / "ds"
    repo.mkdir()
    git_at(repo, "init", "-q")
    for n, tag in ((0, "v1"), (1, "v2")):
        (repo / "setup.py").write_text(f"# {tag}\n")
        git_at(repo, "add", "-A")
        git_at(repo, "commit", "-qm", tag, date=n)
        git_at(repo, "tag", tag)
    spec = tui_env / "revs.yaml"
    spec.write_text(
        (REPO / "configs/experiments/smoke.yaml").read_text()
        + f"revisions:\n  - {{name: main, git: {repo}, ref: v1, install: source}}\n"
    )
    app = DstuiApp(spec_path=spec, supervise=False)
    async with app.run_test(size=(110, 36)) as pilot:
        await pilot.press("1")
        compose = app.screen
        await pilot.press("ctrl+e")
        await pilot.pause()
        editor = app.screen
        assert isinstance(editor, RevisionEditor)
        assert editor.query_one("#rev-install", Input).value == "auto"  # a new revision's default
        table = editor.query_one("#rev-table", DataTable)
        assert table.get_row_at(0)[-1] == "source"
        table.focus()
        table.move_cursor(row=0)
        await pilot.press("enter")
        await pilot.pause()
        assert editor.query_one("#rev-install", Input).value == "source"
        await _type(pilot, editor, "ref", "v2")
        await pilot.click("#rev-save")
        await pilot.pause()
        assert editor.data["revisions"][0] == {"name": "main", "git": str(repo), "ref": "v2", "install": "source"}
        # a second git revision built by pip; an install the spec does not know is refused
        for install in ("conda", "pip"):
            for field, text in (("name", "pipped"), ("source", "git"), ("value", str(repo)), ("ref", "v1"),
                                ("install", install)):  # fmt: skip
                editor.query_one(f"#rev-{field}", Input).value = text  # typing is the test above's
            editor.query_one("#rev-install", Input).focus()
            await pilot.press("enter")  # Enter in a field saves (the toast of the last save may cover the button)
            await pilot.pause()
            if install == "conda":
                error = str(editor.query_one("#rev-error", Static).render())
                assert "install must be one of auto, pip, source (got 'conda')" in error
                assert len(editor.data["revisions"]) == 1
        assert editor.data["revisions"][1]["install"] == "pip"
        await pilot.press("escape")
        await pilot.pause()
        shown = str(compose.query_one("#revisions", Static).render())
        assert "main: git=" in shown and "@v2 (install: source)" in shown and "@v1 (install: pip)" in shown
        out = tui_env / "saved.yaml"
        ui = await _save_as(pilot, compose, out)
    saved = yaml.safe_load(out.read_text())
    assert [(r["name"], r.get("install")) for r in saved["revisions"]] == [("main", "source"), ("pipped", "pip")]
    assert listed(out) == ui


def test_revision_model_helpers() -> None:
    data = {"name": "x"}
    data = cm.put_revision(data, cm.make_revision("main", "git", "~/ds", "master"))
    assert cm.revision_text(data["revisions"][0]) == "main: git=~/ds@master"
    with pytest.raises(ValueError, match="exists already"):
        cm.put_revision(data, cm.make_revision("main", "pypi", "0.18.0"))
    with pytest.raises(ValueError, match="source must be one of"):
        cm.make_revision("x", "svn", "u")
    assert cm.make_revision("p", "pypi", "0.18.0", install=" ") == {"name": "p", "pypi": "0.18.0"}  # auto: unsaid
    assert cm.revision_install({"name": "p", "pypi": "0.18.0"}) == "auto"
    assert "revisions" not in cm.remove_revision(data, 0)  # back to the installed DeepSpeed
