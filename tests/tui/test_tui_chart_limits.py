"""Charts of values that cannot be negative (times, rates, memory) never draw a negative axis.

A 5% pad around a wide range once put the iteration-time axis down to -23 ms and tokens/s
down to -714: the lower limit is clamped at 0 when every value is >= 0.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tui_helpers import T0, home_shown, wait_for, write_run

from dstui.core.rundir import write_json_atomic
from dstui.tui.app import DstuiApp
from dstui.tui.chart_view import Curve, _y_limits
from dstui.tui.screens.live import LiveScreen
from dstui.tui.widgets.charts import MetricPlot

finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, allow_infinity=False)
non_negative = st.floats(min_value=0.0, max_value=1e9, allow_nan=False, allow_infinity=False)


def _limits(ys: list[list[float]]) -> tuple[float, float]:
    """_y_limits of one curve per list of values (no warm-up), which always has limits."""
    lim, _ = _y_limits([Curve(f"c{i}", i, list(range(1, len(y) + 1)), y) for i, y in enumerate(ys)], log=False)
    assert lim is not None
    return lim


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(non_negative, min_size=1, max_size=30), min_size=1, max_size=4))
def test_non_negative_data_keeps_the_axis_at_or_above_zero(ys: list[list[float]]) -> None:
    lo, hi = _limits(ys)
    assert 0.0 <= lo < hi
    assert all(lo <= v <= hi for y in ys for v in y)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(finite, min_size=1, max_size=30), min_size=1, max_size=4))
def test_any_data_lies_inside_the_limits(ys: list[list[float]]) -> None:
    lo, hi = _limits(ys)
    assert lo < hi and all(lo <= v <= hi for y in ys for v in y)
    if min(min(y) for y in ys) < 0:
        assert lo < 0  # negative data (a loss difference) keeps its padding below


@pytest.mark.anyio
async def test_live_view_axes_of_times_and_rates_stay_non_negative(tui_env) -> None:  # noqa: ANN001
    """A fast run beside a slow one: the range is wide, and the padding once went below 0 ms."""
    path = tui_env / "runs" / "wide-20260101-000000"
    path.mkdir(parents=True)
    write_run(path, "fast-r0", order=0, state="done", iter_time=0.015)
    write_run(path, "slow-r0", order=1, state="done", iter_time=0.5)
    write_json_atomic(path / "batch.json", {
        "id": path.name, "experiment": "fixture", "runs": ["fast-r0", "slow-r0"], "parallel": 2,
        "created": T0, "finalized": True,
    })  # fmt: skip
    app = DstuiApp(batch_id=path.name, supervise=False, watch_s=0.3)
    async with app.run_test(size=(120, 36)) as pilot:
        assert await home_shown(pilot)
        await pilot.press("v")
        screen = app.screen
        assert isinstance(screen, LiveScreen)
        it = screen.query_one("#plot-iter", MetricPlot)
        assert await wait_for(pilot, lambda: it.point_count > 0 and it.y_limits is not None, timeout=20)
        await pilot.pause(0.3)
        lo, hi = it.view.y_limits  # seconds
        assert lo >= 0 and hi >= 0.5  # the slow run's steps are inside
        for plot in screen.query(MetricPlot):
            if plot.y_limits is not None and math.isfinite(plot.y_limits[0]):
                assert plot.y_limits[0] >= 0, plot.id


@pytest.mark.parametrize("rows", [2, 3, 6, 7, 11, 30])
def test_y_ticks_sit_one_per_row_at_most(rows: int) -> None:
    """plotext's 7 ticks on a 6-row chart lost one (4.17, 2.57: 3.37 gone, issue 38.3): ticks are at most
    one per canvas row, each exactly on a row, so none shares a row with another."""
    from dstui.tui.widgets.charts import Y_TICKS, row_ticks

    ticks = row_ticks((0.96, 5.78), rows)
    assert 2 <= len(ticks) <= min(Y_TICKS, rows) and ticks[0] == 0.96 and ticks[-1] == pytest.approx(5.78)
    on_rows = [(t - 0.96) / (5.78 - 0.96) * (rows - 1) for t in ticks]
    assert all(abs(r - round(r)) < 1e-9 for r in on_rows) and len({round(r) for r in on_rows}) == len(ticks)
    steps = {round(b - a) for a, b in zip(on_rows, on_rows[1:], strict=False)}
    if any((rows - 1) % (n - 1) == 0 for n in range(4, min(Y_TICKS, rows) + 1)):
        assert len(steps) == 1 and len(ticks) >= 4, (rows, on_rows)  # even steps where the rows allow them


@pytest.mark.anyio
async def test_a_six_row_live_chart_labels_every_row(tui_env) -> None:  # noqa: ANN001
    """At 130x34 the live view's charts have 6 canvas rows: six y labels, evenly spaced, none lost."""
    import re

    path = tui_env / "runs" / "six-20260101-000000"
    path.mkdir(parents=True)
    write_run(path, "a-r0", order=0, state="done")
    write_json_atomic(path / "batch.json", {"id": path.name, "experiment": "fixture", "runs": ["a-r0"],
                                            "created": T0, "finalized": True})  # fmt: skip
    app = DstuiApp(batch_id=path.name, supervise=False, watch_s=0.3)
    async with app.run_test(size=(130, 34)) as pilot:
        assert await home_shown(pilot)
        await pilot.press("v")
        loss = app.screen.query_one("#plot-loss", MetricPlot)
        assert await wait_for(pilot, lambda: loss.point_count > 0, timeout=20)
        await pilot.pause(0.3)
        assert loss.size.height - 5 == 6  # the size this test is about
        lines = str(loss.render()).splitlines()
        labels = [float(m[1]) for line in lines if (m := re.match(r"^\s*(-?[\d.]+)┤", line))]
        assert len(labels) == 6, lines
        steps = [a - b for a, b in zip(labels, labels[1:], strict=False)]
        assert all(s > 0 for s in steps) and max(steps) - min(steps) <= 0.11, labels  # even, to the labels' rounding
