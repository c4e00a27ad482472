"""Live view (issue 27.5): coinciding runs stay visible, log scale / hide warm-up change the axis,
the log pane follows the running run, charts are paged at 80x24. Screenshots: see save_shot."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from textual.widgets import Log, Static
from tui_helpers import REPO, T0, home_shown, wait_for, write_run

from dstui.core.rundir import BatchDir, write_json_atomic
from dstui.tui.app import DstuiApp
from dstui.tui.screens.live import LiveScreen
from dstui.tui.widgets.charts import MetricPlot

pytestmark = pytest.mark.anyio

SIZES = [(120, 36), (80, 24)]


def save_shot(app: DstuiApp, tmp: Path, name: str) -> Path:
    """An SVG screenshot; copied into docs/screenshots/ when DSTUI_SAVE_SCREENSHOTS=1 (to refresh the docs)."""
    path = Path(app.save_screenshot(filename=f"{name}.svg", path=str(tmp)))
    assert path.stat().st_size > 1000
    if os.environ.get("DSTUI_SAVE_SCREENSHOTS") == "1":
        shutil.copy(path, REPO / "docs" / "screenshots" / path.name)
    return path


def make_batch(root: Path, runs: list[tuple[str, int, str]], batch_id: str = "live-20260101-000000") -> BatchDir:
    """runs: (name, order used for the values, state); two runs with the same order have identical values."""
    path = root / "runs" / batch_id
    path.mkdir(parents=True)
    for name, order, state in runs:
        write_run(path, name, order=order, state=state, iter_time=0.015, loss0=6.0 + 0.5 * order)
    write_json_atomic(path / "batch.json", {
        "id": batch_id, "experiment": "fixture", "runs": [r[0] for r in runs], "parallel": 2,
        "created": T0, "finalized": False,
    })  # fmt: skip
    return BatchDir(path)


async def open_live(pilot, app) -> LiveScreen:  # noqa: ANN001
    assert await home_shown(pilot)
    await pilot.press("v")
    screen = app.screen
    assert isinstance(screen, LiveScreen)
    assert await wait_for(pilot, lambda: screen.query_one("#plot-loss", MetricPlot).point_count > 0, timeout=20)
    await pilot.pause(0.3)
    return screen


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_identical_runs_are_all_visible(tui_env, tmp_path, size):  # noqa: F811
    """Two repeats with the same values: one line, the other a distinct marker on it, and a note."""
    b = make_batch(tui_env, [("a-r0", 0, "done"), ("a-r1", 0, "done"), ("b-r0", 1, "done")])
    app = DstuiApp(batch_id=b.id, supervise=False, watch_s=0.3)
    async with app.run_test(size=size) as pilot:
        screen = await open_live(pilot, app)
        loss = screen.query_one("#plot-loss", MetricPlot)
        drawn = {d.label: d for d in loss.drawn}
        assert drawn["a-r0"].marker == "line" and drawn["b-r0"].marker == "line"
        assert drawn["a-r1"].marker not in ("line", "braille") and drawn["a-r1"].same_as == "a-r0"
        assert loss.view.groups == [["a-r0", "a-r1"]]
        assert "2 runs identical" in loss.full_title
        legend = str(screen.query_one("#legend", Static).render())
        assert f"{drawn['a-r1'].marker} a-r1 (loss = a-r0)" in legend and "a-r0 (2 identical)" in legend
        # the marker glyphs are in the drawn chart, in a-r1's colour
        rendered = loss.render()
        assert drawn["a-r1"].marker in getattr(rendered, "plain", str(rendered))
        for p in screen.visible_plots():  # every title is drawn (plotext drops one that does not fit)
            await pilot.pause()
            assert p.title in getattr(p.render(), "plain", ""), p.id
        if size == (80, 24):
            # fewer charts at once: each gets the height, c pages to the others
            assert [p.id for p in screen.visible_plots()] == ["plot-loss"]
            assert loss.size.height >= 10
            await pilot.press("c")
            await pilot.pause()
            assert [p.id for p in screen.visible_plots()] == ["plot-iter"]
            assert "charts 2/4" in str(screen.query_one("#log-title", Static).render())
            await pilot.press("c", "c", "c")
            await pilot.pause()
        else:
            assert len(screen.visible_plots()) == 4
            assert all(p.size.height >= 10 for p in screen.visible_plots())
        save_shot(app, tmp_path, f"live_{size[0]}x{size[1]}")


async def test_log_scale_and_hide_warmup_change_the_axis(tui_env):  # noqa: F811
    """The first step (3x the others: a compile spike) no longer sets the iteration-time axis;
    w drops the warm-up steps (loss range shrinks), l puts the axis on a log scale."""
    b = make_batch(tui_env, [("a-r0", 0, "done"), ("b-r0", 1, "done")])
    app = DstuiApp(batch_id=b.id, supervise=False, watch_s=0.3)
    async with app.run_test(size=(120, 36)) as pilot:
        screen = await open_live(pilot, app)
        it = screen.query_one("#plot-iter", MetricPlot)
        loss = screen.query_one("#plot-loss", MetricPlot)
        assert it.unit == "ms"
        spike = max(screen.series[0].steps["iter_time"].y) * 1000  # 45 ms at step 1
        lo, hi = it.y_limits
        assert spike == pytest.approx(45.0) and hi < 20.0 and lo > 10.0  # steady steps ~13.5-16.5 ms
        assert "warm-up off scale" in it.full_title
        loss_hi = loss.y_limits[1]
        first_loss = screen.series[0].steps["loss"].y[0]
        assert loss_hi >= first_loss  # loss keeps its first steps in range
        await pilot.press("w")
        await pilot.pause()
        assert screen.hide_warmup and min(min(c.x) for c in it.view.curves) == 3.0  # warmup_steps = 2
        assert loss.y_limits[1] < first_loss  # steps 1-2 gone: the loss axis top came down
        assert "no warm-up" in it.full_title
        await pilot.press("l")
        await pilot.pause()
        assert it.y_scale == "log" and loss.y_scale == "log"
        steady = [y * 1000 for s in screen.series for x, y in zip(s.steps["iter_time"].x, s.steps["iter_time"].y, strict=True) if x > 2]
        llo, lhi = it.y_limits
        assert 0 < llo < min(steady) and max(steady) < lhi < spike and (llo, lhi) != pytest.approx((lo, hi))
        it.render()
        assert it.plt._active.monitor.yscale[0] == "log"  # what plotext draws with
        await pilot.press("l", "w")
        await pilot.pause()
        assert it.y_scale == "linear" and it.y_limits == pytest.approx((lo, hi))


async def test_log_pane_follows_the_running_run(tui_env):  # noqa: F811
    b = make_batch(tui_env, [("a-r0", 0, "done"), ("b-r0", 1, "done"), ("c-r0", 2, "queued")])
    # b-r0 is running (started after a-r0 finished)
    b.path.joinpath("b-r0", "status.json").write_text(json.dumps({
        "name": "b-r0", "state": "running", "started": T0 + 70, "steps_total": 20, "steps_done": 20,
    }))  # fmt: skip
    app = DstuiApp(batch_id=b.id, supervise=False, watch_s=0.2)
    async with app.run_test(size=(120, 36)) as pilot:
        screen = await open_live(pilot, app)
        log = screen.query_one("#log-tail", Log)
        title = screen.query_one("#log-title", Static)
        assert await wait_for(pilot, lambda: any("of b-r0" in x for x in log.lines), timeout=20)
        assert not any("of a-r0" in x for x in log.lines)
        assert "following" in str(title.render()) and "b-r0" in str(title.render())
        # b-r0 ends, c-r0 starts: the pane moves on
        b.path.joinpath("b-r0", "status.json").write_text(json.dumps({"name": "b-r0", "state": "done", "started": T0 + 70}))
        b.path.joinpath("c-r0", "status.json").write_text(json.dumps({"name": "c-r0", "state": "running", "started": T0 + 130}))
        with open(b.path / "c-r0" / "stdout.log", "a") as fh:
            fh.write("c-r0 is training now\n")
        assert await wait_for(pilot, lambda: any("c-r0 is training now" in x for x in log.lines), timeout=20)
        assert "c-r0" in str(title.render())
        # picking a run by hand pins the pane; f follows again
        await pilot.press("n")
        assert await wait_for(pilot, lambda: any("of a-r0" in x for x in log.lines), timeout=20)
        assert not screen.follow and "f: follow" in str(title.render())
        await pilot.press("f")
        assert await wait_for(pilot, lambda: any("c-r0 is training now" in x for x in log.lines), timeout=20)
        assert screen.follow
