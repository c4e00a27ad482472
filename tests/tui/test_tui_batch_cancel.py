"""Runs screen: cancelling a whole batch asks first, then stops every unfinished run (as `dstui cancel BATCH`);
the header says where the runs are when dstui chose the folder."""

from __future__ import annotations

import pytest
from tui_helpers import REPO, home_shown, workers_done, write_run

from dstui.core.rundir import BatchDir, write_json_atomic
from dstui.tui.app import DstuiApp
from dstui.tui.screens.confirm import ConfirmScreen
from dstui.tui.widgets.cached_table import CachedTable

pytestmark = pytest.mark.anyio


def queued_batch(root) -> BatchDir:  # noqa: ANN001
    """A batch nobody supervises yet: one run done, two queued (a cancel ends those at once)."""
    path = root / "runs" / "wait-20260101-000000"
    path.mkdir(parents=True)
    runs = [("a-r0", "done"), ("b-r0", "queued"), ("c-r0", "queued")]
    for i, (name, state) in enumerate(runs):
        write_run(path, name, order=i, state=state)
    write_json_atomic(path / "batch.json", {"id": path.name, "experiment": "wait", "runs": [r[0] for r in runs],
                                            "spec_path": str(REPO / "configs/experiments/smoke.yaml"),
                                            "parallel": 1, "created": 1_790_000_000.0, "finalized": False})  # fmt: skip
    return BatchDir(path)


async def test_cancel_batch_is_confirmed(tui_env) -> None:  # noqa: ANN001
    b = queued_batch(tui_env)
    app = DstuiApp(batch_id=b.id, supervise=False, watch_s=0.2)
    async with app.run_test(size=(100, 30)) as pilot:
        assert await home_shown(pilot)
        screen = app.screen
        screen.query_one("#batches", CachedTable).focus()
        await pilot.press("c")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen) and "Cancel batch wait-20260101-000000?" in app.screen.question
        assert "2 unfinished run(s)" in app.screen.question
        await pilot.press("n")  # no: nothing changes
        await pilot.pause()
        assert app.screen is screen and [rd.state for rd in b.runs()] == ["done", "queued", "queued"]
        screen.query_one("#runs", CachedTable).focus()
        await pilot.press("C")  # from the runs table too
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await workers_done(app)
        await pilot.pause()
        assert [rd.state for rd in b.runs()] == ["done", "killed", "killed"]
        assert b.runs()[1].status()["reason"] == "cancelled before start"


async def test_header_says_where_runs_are_when_dstui_chose(tui_env, monkeypatch) -> None:  # noqa: ANN001
    """Without DSTUI_HOME the home is this folder's runs/ (it holds a batch): the header says so."""
    b = queued_batch(tui_env)
    monkeypatch.delenv("DSTUI_HOME")
    (tui_env / "sub").mkdir()
    monkeypatch.chdir(tui_env / "sub")  # found from a folder below
    app = DstuiApp(supervise=False)
    async with app.run_test(size=(100, 30)) as pilot:
        assert await home_shown(pilot)
        assert app.sub_title == f"runs: {tui_env.resolve() / 'runs'}"
        assert app.screen.batch is not None and app.screen.batch.id == b.id
