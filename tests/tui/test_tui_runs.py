"""Runs screen: launch from the UI, cancel (process group gone), retry, log, leave and come back; a real batch."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from textual.widgets import Log
from tui_helpers import REPO, confirm_launch, seed_spec, wait_for

from dstui.core.rundir import FINAL_STATES, RunDir, list_batches
from dstui.execute import batch as batch_mod
from dstui.execute.gpu_share import AUTO
from dstui.tui.app import DstuiApp
from dstui.tui.screens.log import LogScreen
from dstui.tui.screens.runs import RunsScreen
from dstui.tui.widgets.time_bar import TimeBar

pytestmark = pytest.mark.anyio


def states(screen: RunsScreen) -> list[str]:
    return [str(cells[2]) for cells in screen._rows.values()]


def why_not_done(screen: RunsScreen) -> str:
    """Each run that did not finish, with its recorded reason and the end of its log."""
    out = [f"states: {states(screen)}"]
    for rd in screen.batch.runs() if screen.batch else []:
        if rd.state != "done":
            st = rd.status()
            out.append(f"--- {rd.name}: {st.get('state')} ({st.get('reason')}), exit {st.get('exit_code')}")
            out.append(rd.log_tail(3000))
    return "\n".join(out)


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.e2e  # starts supervisors / the CLI in subprocesses
async def test_launch_from_ui_reaches_done(tui_env):  # noqa: F811
    spec = seed_spec(tui_env)
    app = DstuiApp(spec_path=spec, supervise=False, watch_s=0.3)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        await pilot.press("l")
        await confirm_launch(pilot)
        assert await wait_for(pilot, lambda: screen.batch is not None and screen._rows, timeout=240)
        assert await wait_for(pilot, lambda: states(screen) == ["done"], timeout=240), states(screen)
        row = screen._rows["echo-r0"]
        assert row[3] == "5/5" and row[5] == "1"  # progress and last loss (5.0 / 5)
        assert screen.batch.info()["parallel"] == AUTO  # the default of `dstui run`, not one at a time
        # the log viewer shows the run's stdout
        await pilot.press("o")
        await pilot.pause(0.5)
        assert isinstance(app.screen, LogScreen)
        log = app.screen.query_one(Log)
        assert await wait_for(pilot, lambda: any("Step 5, Loss" in line for line in log.lines), timeout=30)
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, RunsScreen)


@pytest.mark.e2e  # starts supervisors / the CLI in subprocesses
async def test_cancel_kills_process_group_then_retry(tui_env):  # noqa: F811
    spec = seed_spec(tui_env, name="sleepy", sleep_s=30, steps=4)
    app = DstuiApp(spec_path=spec, supervise=False, watch_s=0.3)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.screen
        await pilot.press("l")
        await confirm_launch(pilot)
        assert await wait_for(pilot, lambda: states(screen) == ["running"], timeout=240), states(screen)
        rd = RunDir(screen.batch.path / "echo-r0")
        assert await wait_for(pilot, lambda: rd.status().get("pgid"), timeout=240)
        pgid = rd.status()["pgid"]
        assert not group_gone(pgid)
        await pilot.press("c")
        await pilot.pause()
        await pilot.press("y")
        assert await wait_for(pilot, lambda: group_gone(pgid), timeout=240)
        assert await wait_for(pilot, lambda: states(screen) == ["killed"], timeout=240), states(screen)
        # retry: queued again, a new process group starts
        await pilot.press("r")
        assert await wait_for(pilot, lambda: rd.status().get("pgid") not in (None, pgid)
                              and rd.state == "running", timeout=240), rd.status()  # fmt: skip
        assert (rd.path / "attempts" / "1").is_dir()
        pgid2 = rd.status()["pgid"]
        await pilot.press("c")
        await pilot.pause()
        await pilot.press("y")
        assert await wait_for(pilot, lambda: group_gone(pgid2), timeout=240)


@pytest.mark.e2e  # starts supervisors / the CLI in subprocesses
async def test_leave_and_come_back_takes_over(tui_env):  # noqa: F811
    """A batch whose supervisor is gone is taken over when the TUI starts."""
    spec = seed_spec(tui_env, name="orphan")
    b = batch_mod.create(batch_mod.plan(spec, validate=False))  # folders only, nobody supervising
    b.update_info(created=b.info()["created"] - 120)  # launched a while ago, then the terminal went away
    app = DstuiApp(watch_s=0.3)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.screen
        assert await wait_for(pilot, lambda: screen.batch is not None and screen.batch.id == b.id)
        assert await wait_for(pilot, lambda: all(r.state in FINAL_STATES for r in b.runs()), timeout=240)
        assert await wait_for(pilot, lambda: states(screen) == ["done"], timeout=10)


@pytest.mark.e2e  # starts a supervisor in a subprocess
async def test_a_half_made_batch_is_settled_when_the_tui_finds_it(tui_env):  # noqa: F811
    """Issue 33.2: a batch a killed `dstui run` left half laid out is completed (its missing run
    failed, with the reason) by the TUI's takeover, and finalized; every run is listed."""
    from dstui.execute import creation

    spec = seed_spec(tui_env, name="halfmade")
    b = batch_mod.create(batch_mod.plan(spec, validate=False))
    # as a kill mid-layout leaves it: two more runs named in batch.json, one folder empty, one never made
    b.update_info(created=b.info()["created"] - 120, runs=[*b.info()["runs"], "ghost-r0", "ghost-r1"], **{creation.COMPLETE: False})
    (b.path / "ghost-r0").mkdir()
    assert [rd.name for rd in b.runs()] == ["echo-r0", "ghost-r0"]  # (the empty one used to wedge the supervisor)
    app = DstuiApp(watch_s=0.3)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.screen
        assert await wait_for(pilot, lambda: screen.batch is not None and screen.batch.id == b.id)
        assert await wait_for(pilot, lambda: bool(b.info().get("finalized")), timeout=240)
        assert await wait_for(pilot, lambda: sorted(states(screen)) == ["done", "failed", "failed"], timeout=10), why_not_done(screen)
    assert [rd.name for rd in b.runs()] == ["echo-r0", "ghost-r0", "ghost-r1"]
    assert {RunDir(b.path / n).status()["reason"] for n in ("ghost-r0", "ghost-r1")} == {creation.NEVER_CREATED}
    assert creation.is_complete(b) and "--resume" in b.info()[creation.PROBLEM]


@pytest.mark.e2e
@pytest.mark.timeout(1800)
@pytest.mark.xdist_group("smoke-batch")  # beside test_pipeline's reader of the same batch
async def test_e2e_real_cpu_smoke_from_ui(tui_env, smoke_batch, monkeypatch):  # noqa: F811
    """The real bundled runner under DeepSpeed on CPU (2 ranks, ZeRO 0-3), in the runs screen.

    The batch is the session's one real smoke batch (conftest's ``smoke_batch``, also read by
    tests/e2e/test_pipeline.py), not a second launch of it; launching from the UI is
    test_launch_from_ui_reaches_done's.
    """
    if shutil.which("deepspeed") is None and not (REPO / "runners" / "train.py").exists():
        pytest.skip("no runner")
    monkeypatch.setenv("DSTUI_HOME", smoke_batch["home"])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", smoke_batch["uri"])
    (batch,) = list_batches(Path(smoke_batch["home"]) / "runs")
    app = DstuiApp(batch_id=batch.id, supervise=False)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.screen
        assert await wait_for(pilot, lambda: len(screen._rows) == 4, timeout=180)
        ok = await wait_for(pilot, lambda: all(s in FINAL_STATES for s in states(screen)), timeout=1700)
        assert ok and states(screen) == ["done"] * 4, why_not_done(screen)
        # where the time of a real run went: every segment, the step share, and the batch's share
        bar = screen.query_one(TimeBar)
        assert await wait_for(pilot, lambda: "step share" in str(bar.render()), timeout=30), str(bar.render())
        text = str(bar.render())
        assert text.startswith("time z0-r0") and "% of wall" in text, text
        for seg in ("launch", "imports", "init", "compile", "steps", "teardown"):
            assert re.search(rf"{seg} \d+\.\d", text), (seg, text)
        assert [screen._rows[n][9] for n in screen._rows] == ["-"] * 4  # no GPUs here: DeepSpeed's default devices
