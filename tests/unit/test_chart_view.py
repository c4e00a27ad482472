"""What a TUI chart shows of its curves (dstui/tui/chart_view.py, chart_pages.py, results_chart_data.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstui.tui.chart_pages import charts_per_page, grid_shape
from dstui.tui.chart_view import Curve, ViewOptions, plan
from dstui.tui.results_chart_data import band, curves_for, group_runs


def test_warmup_spike_does_not_set_the_range_and_can_be_hidden():
    steps = [1.0, 2.0, 3.0, 4.0, 5.0]
    it = Curve("a", 0, steps, [0.8, 0.015, 0.016, 0.014, 0.015], warmup=1)
    p = plan([it], ViewOptions())
    lo, hi = p.y_limits
    assert hi < 0.02 and lo > 0.01 and p.warmup_clipped
    hidden = plan([it], ViewOptions(hide_warmup=True))
    assert list(hidden.curves[0].x) == [2.0, 3.0, 4.0, 5.0] and not hidden.warmup_clipped
    loss = Curve("a", 0, steps, [6.0, 5.0, 4.0, 3.0, 2.0], warmup=1, range_skips_warmup=False)
    assert plan([loss], ViewOptions()).y_limits[1] > 6.0


def test_log_scale_uses_positive_values_only():
    c = Curve("a", 0, [1.0, 2.0, 3.0], [0.0, 10.0, 1000.0])
    lo, hi = plan([c], ViewOptions(log_y=True)).y_limits
    assert 0 < lo < 10 and hi > 1000


def test_identical_curves_are_grouped_and_drawn_as_markers():
    x = [1.0, 2.0, 3.0]
    curves = [Curve("a", 0, x, [3.0, 2.0, 1.0]), Curve("b", 1, x, [3.0, 2.0, 1.0]),
              Curve("c", 2, x, [3.0, 2.0, 1.5]), Curve("d", 3, x, [3.0, 2.0, 1.0])]  # fmt: skip
    p = plan(curves, ViewOptions())
    assert p.groups == [["a", "b", "d"]] and p.note == "3 runs identical"
    assert [d.marker for d in p.drawn] == ["line", "x", "line", "+"]
    assert p.drawn[1].same_as == "a" and p.drawn[3].same_as == "a"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=0, max_size=40),
       st.integers(0, 5), st.booleans(), st.booleans())  # fmt: skip
def test_plan_never_fails_and_limits_are_ordered(ys, warmup, log, hide):
    c = Curve("a", 0, [float(i + 1) for i in range(len(ys))], ys, warmup=warmup)
    p = plan([c], ViewOptions(log_y=log, hide_warmup=hide))
    if p.y_limits is not None:
        lo, hi = p.y_limits
        assert math.isfinite(lo) and math.isfinite(hi) and lo < hi
        assert not log or lo > 0


@pytest.mark.parametrize(("size", "per", "shape"), [((120, 36), 4, (2, 2)), ((80, 24), 1, (1, 1)),
                                                    ((120, 24), 2, (2, 1)), ((80, 40), 2, (1, 2))])  # fmt: skip
def test_charts_per_page(size, per, shape):
    assert charts_per_page(*size) == per and grid_shape(per, *size) == shape


def run(rid: str, batch: str, label: str, steps: list[int], values: list[float]) -> SimpleNamespace:
    hist = {"iter_time": (np.array(steps), np.array(values))}
    return SimpleNamespace(run_id=rid, batch=batch, label=label, condition=label, history=hist,
                           params={"warmup_steps": "1"}, metrics={}, param=lambda n, d=None: 1)  # fmt: skip


def test_groups_bands_and_curves():
    runs = [run("1", "b1", "z0", [1, 2, 3], [9.0, 1.0, 2.0]), run("2", "b1", "z0", [1, 2], [9.0, 3.0]),
            run("3", "b2", "z0", [1, 2, 3], [9.0, 5.0, 5.0])]  # fmt: skip
    groups = group_runs(runs, {"1": "e", "2": "e", "3": "e"})
    assert [g.name for g in groups] == ["z0 @b1", "z0 @b2"]
    b = band(groups[0].runs, "iter_time")
    assert b.steps == [1.0, 2.0, 3.0] and b.mean == [9.0, 2.0, 2.0] and b.low == [9.0, 1.0, 2.0] and b.high == [9.0, 3.0, 2.0]
    curves = curves_for(groups, "iter_time")
    assert [(c.label, c.raw) for c in curves] == [("z0 @b1", True), ("z0 @b1", True), ("z0 @b1", False), ("z0 @b2", False)]
    assert all(c.warmup == 1 for c in curves)
