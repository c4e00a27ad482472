"""Live view: series read incrementally, decimated plots, smoothing, many long runs."""

from __future__ import annotations

import json
import time
from array import array

import pytest
from helpers import HEAVY
from textual.widgets import Log
from tui_helpers import fixture_batch, home_shown, wait_for, write_run

from dstui.core.rundir import BatchDir, RunDir
from dstui.tui.app import DstuiApp
from dstui.tui.screens.live import LiveScreen
from dstui.tui.series import RunSeries, decimate, ema
from dstui.tui.widgets.charts import MetricPlot

pytestmark = pytest.mark.anyio


def test_decimate_keeps_extremes_and_bounds_points():
    n = 100_000
    x = array("d", range(n))
    y = array("d", [float(i % 100) for i in range(n)])
    y[50_000] = 1e6  # one spike must survive
    y[70_000] = -1e6
    dx, dy = decimate(x, y, 80)
    assert len(dx) <= 160
    assert max(dy) == 1e6 and min(dy) == -1e6
    assert dx == sorted(dx)
    small_x, small_y = decimate([1.0, 2.0], [3.0, 4.0], 80)
    assert small_x == [1.0, 2.0] and small_y == [3.0, 4.0]


def test_ema_and_nan():
    assert ema([1.0, 1.0, 1.0], 0.5) == [1.0, 1.0, 1.0]
    out = ema([0.0, 10.0, float("nan")], 0.5)
    assert out == [0.0, 5.0, 5.0]


def test_series_reads_only_new_lines(tui_env):  # noqa: F811
    b = fixture_batch(tui_env)
    rd = RunDir(b.path / "z0-r0")
    s = RunSeries(rd)
    assert s.poll()
    assert len(s.steps["loss"]) == 20 and len(s.system["cpu"]) == 20
    assert not s.poll()  # nothing new
    with open(rd.metrics_file, "a") as fh:
        fh.write(json.dumps({"type": "step", "step": 21, "loss": 0.5, "iter_time": 0.1}) + "\n")
        fh.write('{"type": "step", "step": 22, "lo')  # half a line: not read yet
    assert s.poll()
    assert list(s.steps["loss"].x[-1:]) == [21.0] and len(s.steps["loss"]) == 21
    assert len(s.smooth["loss"]) == 21


async def test_live_view_draws_runs_and_log(tui_env):  # noqa: F811
    b = fixture_batch(tui_env)
    app = DstuiApp(batch_id=b.id, supervise=False, watch_s=0.3)
    async with app.run_test(size=(100, 30)) as pilot:
        assert await home_shown(pilot)
        await pilot.press("v")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, LiveScreen)
        loss = screen.query_one("#plot-loss", MetricPlot)
        assert await wait_for(pilot, lambda: loss.point_count > 0, timeout=10)
        assert len(screen.series) == 4
        assert screen.query_one("#plot-sys", MetricPlot).title == "job CPU"
        log = screen.query_one("#log-tail", Log)
        assert await wait_for(pilot, lambda: any("fixture log line 30 of z0-r0" in x for x in log.lines))
        await pilot.press("n")
        assert await wait_for(pilot, lambda: any("of z1-r0" in x for x in log.lines))
        n_raw = loss.point_count
        await pilot.press("s")  # EMA on: raw kept (dimmed) + smoothed
        await pilot.pause()
        assert loss.point_count == 2 * n_raw and "EMA" in loss.title
        await pilot.press("y")
        await pilot.pause()
        assert screen.query_one("#plot-sys", MetricPlot).title == "job RSS"
        # a growing run shows up on the next tick
        with open(b.path / "z0-r0" / "metrics.jsonl", "a") as fh:
            fh.write(json.dumps({"type": "step", "step": 99, "loss": 0.1, "iter_time": 0.1, "mem_peak": 1e9}) + "\n")
        assert await wait_for(pilot, lambda: screen.series[0].steps["loss"].x[-1] == 99.0)


@HEAVY
async def test_live_view_eight_long_runs_stays_responsive(tui_env):  # noqa: F811
    """8 runs x 20k steps: first full draw and a redraw stay well under a second."""
    path = tui_env / "runs" / "long-20260101-000000"
    path.mkdir(parents=True)
    names = []
    for i in range(8):
        rd = write_run(path, f"c{i}-r0", order=i, state="done", steps=20_000, log_lines=5)
        names.append(rd.name)
    (path / "batch.json").write_text(json.dumps({"id": path.name, "experiment": "long", "runs": names,
                                                 "created": 1.0, "finalized": True}))  # fmt: skip
    b = BatchDir(path)
    app = DstuiApp(batch_id=b.id, supervise=False, watch_s=0.5)
    async with app.run_test(size=(160, 50)) as pilot:
        assert await home_shown(pilot)
        await pilot.press("v")
        screen = app.screen
        assert await wait_for(pilot, lambda: all(len(s.steps["loss"]) == 20_000 for s in screen.series), timeout=60)
        await pilot.pause(0.5)
        plots = list(screen.query(MetricPlot))
        t = time.perf_counter()
        for _ in range(3):
            screen.redraw()
            for p in plots:
                p._built_for = None
                p.render()
        per_redraw = (time.perf_counter() - t) / 3
        assert per_redraw < 1.0, per_redraw
