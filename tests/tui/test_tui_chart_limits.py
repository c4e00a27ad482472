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
