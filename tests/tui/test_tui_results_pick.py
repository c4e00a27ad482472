"""Results (issue 27.6): pick runs across batches and experiments, chart them together, export them;
the table's columns fit 120 and 80 columns. Real MLflow store (SQLite), real app under Pilot."""

from __future__ import annotations

import pytest
from helpers import HEAVY
from test_tui_live_views import save_shot
from textual.widgets import DataTable, Select
from tui_helpers import make_store, wait_for

from dstui.tui.app import DstuiApp
from dstui.tui.screens.results import ResultsScreen
from dstui.tui.screens.results_chart import ResultsChartScreen
from dstui.tui.widgets.charts import MetricPlot

pytestmark = pytest.mark.anyio

# batch fixture-b2 of experiment "fixture": z0 again, slower, repeats that differ (a visible band)
B2_ITERS = {0: [9.0, 9.0, 0.50, 0.52, 0.51, 0.53], 1: [9.0, 9.0, 0.70, 0.72, 0.71, 0.73]}


def add_batch(experiment: str, batch: str, condition: str, iters: dict[int, list[float]], loss_off: float) -> None:
    """Another batch as the supervisor lays it out: a parent run and a child per repeat."""
    from dstui.tracking import client as tracking

    c = tracking.client()
    exp = tracking.ensure_experiment(c, experiment)
    parent = tracking.create_run(c, exp, batch, tags={"dstui.role": "batch", "dstui.batch": batch})
    for repeat, its in iters.items():
        rid = tracking.create_run(c, exp, f"{condition}-r{repeat}", parent_id=parent, tags={
            "dstui.role": "run", "dstui.batch": batch, "dstui.condition": condition, "dstui.revision": "installed",
            "dstui.repeat": repeat, "dstui.kind": "train", "dstui.status": "done", "dstui.order": repeat,
        })  # fmt: skip
        tracking.log_params(c, rid, {"warmup_steps": 2, "steps": len(its), "zero_stage": 3})
        points = []
        for step, it in enumerate(its, start=1):
            points += [
                ("iter_time", it, 2000 + step, step),
                ("loss", 7.0 - 0.5 * step + loss_off + 0.1 * repeat, 2000 + step, step),
                ("mem_peak", 3e9 + 1e8 * repeat, 2000 + step, step),
                ("tokens_per_s", 100 / it, 2000 + step, step),
            ]
        tracking.log_metrics(c, rid, points)
        tracking.finish(c, rid, "FINISHED")
    tracking.finish(c, parent, "FINISHED")


async def loaded(pilot, screen: ResultsScreen, experiment: str) -> None:  # noqa: ANN001
    """Wait for the first load, then show ``experiment`` (through its Select, as a user would)."""
    assert await wait_for(pilot, lambda: screen.results is not None, timeout=120)
    if screen.results.experiment != experiment:
        screen.query_one("#experiment", Select).value = experiment
        assert await wait_for(pilot, lambda: screen.results.experiment == experiment, timeout=120)
    await pilot.pause(0.2)


async def filter_and_pick_all(pilot, screen: ResultsScreen, text: str) -> list[str]:  # noqa: ANN001
    await pilot.press("slash")
    inp = screen.query_one("#filter")
    inp.value = ""
    await pilot.press(*text)
    await pilot.press("enter")
    await pilot.pause()
    names = [f"{r.batch}/{r.run_name}" for r in screen.rows()]
    await pilot.press("a")
    await pilot.pause()
    return names


@pytest.mark.parametrize("size", [(120, 36), (80, 24)], ids=lambda s: f"{s[0]}x{s[1]}")
@HEAVY
async def test_results_charts_runs_picked_from_two_batches(tui_env, tmp_path, size):  # noqa: F811
    make_store()  # experiment fixture, batch fixture-b1: z0, z1, z2 x 2 repeats
    add_batch("fixture", "fixture-b2", "z0", B2_ITERS, loss_off=0.5)
    add_batch("other", "other-b1", "y9", {0: [9.0, 9.0, 0.3, 0.3, 0.3, 0.3]}, loss_off=-1.0)
    app = DstuiApp(supervise=False)
    async with app.run_test(size=size) as pilot:
        await pilot.press("3")
        screen = app.screen
        assert isinstance(screen, ResultsScreen)
        await loaded(pilot, screen, "fixture")
        await pilot.press("g")  # one row per run
        # filter by tag and param text, then pick what is shown: z0 of batch b1, then of batch b2
        assert await filter_and_pick_all(pilot, screen, "z0 batch=fixture-b1") == ["fixture-b1/z0-r0", "fixture-b1/z0-r1"]
        assert await filter_and_pick_all(pilot, screen, "zero_stage=3") == ["fixture-b2/z0-r0", "fixture-b2/z0-r1"]
        assert len(screen.picked) == 4
        await pilot.press("slash")
        screen.query_one("#filter").value = ""
        await pilot.press("enter")
        await pilot.pause()
        table = screen.query_one("#results", DataTable)
        marks = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        assert sum(m.startswith("●") for m in marks) == 4
        save_shot(app, tmp_path, f"results_{size[0]}x{size[1]}")
        # the columns fit: every header whole, the status column last, nothing past the table's width
        cols = list(table.columns.values())
        assert sum(c.get_render_width(table) for c in cols) <= table.size.width
        titles = [str(c.label) for c in cols]
        assert all(c.width >= len(str(c.label)) for c in cols), [(str(c.label), c.width) for c in cols]
        assert titles[0] == "condition" and titles[-1] == "status / reason" and "final loss" in titles
        assert ("time/base [95% CI]" in titles) == (size[0] >= 120)
        # another experiment: the picks stay, one more run joins them
        await loaded(pilot, screen, "other")
        table.focus()
        table.move_cursor(row=0)
        await pilot.press("space")
        await pilot.pause()
        assert len(screen.picked) == 5 and set(screen.picked_experiment.values()) == {"fixture", "other"}
        await pilot.press("c")
        chart = app.screen
        assert isinstance(chart, ResultsChartScreen)
        assert await wait_for(pilot, lambda: chart.groups, timeout=60)
        await pilot.pause(0.3)
        assert [g.name for g in chart.groups] == ["fixture/z0 @fixture-b1", "fixture/z0 @fixture-b2", "other/y9 @other-b1"]
        it = chart.query_one("#rplot-iter_time", MetricPlot)
        means = {c.label: c for c in it.view.curves if not c.raw}
        b2 = means["fixture/z0 @fixture-b2"]
        assert list(b2.x) == [1, 2, 3, 4, 5, 6]
        assert b2.y[2] == pytest.approx(0.60)  # mean of 0.50 and 0.70 at step 3
        bands = [c for c in it.view.curves if c.raw and c.label == b2.label]
        assert [c.y[2] for c in bands] == pytest.approx([0.50, 0.70])  # the repeats' spread
        assert not any(c.raw for c in it.view.curves if c.label.startswith("other/"))  # n=1: no band
        lo, hi = it.y_limits  # seconds -> ms; the 9 s warm-up steps do not set the axis
        assert it.unit == "ms" and hi < 1000 and lo > 50
        for key in ("loss", "mem_peak", "tokens_per_s"):
            plot = chart.query_one(f"#rplot-{key}", MetricPlot)
            assert {d.label for d in plot.drawn} == {g.name for g in chart.groups}
        if size == (80, 24):
            assert len(chart.visible_plots()) == 1 and chart.visible_plots()[0].size.height >= 12
            await pilot.press("c")
            await pilot.pause()
            assert chart.visible_plots()[0].id == "rplot-iter_time"
        else:
            assert len(chart.visible_plots()) == 4
        save_shot(app, tmp_path, f"results_chart_{size[0]}x{size[1]}")


@HEAVY
async def test_results_export_of_picked_runs_writes_a_report(tui_env):  # noqa: F811
    """e exports the picked runs (two batches) through the report's entry point: a real report."""
    make_store()
    add_batch("fixture", "fixture-b2", "z0", B2_ITERS, loss_off=0.5)
    app = DstuiApp(supervise=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("3")
        screen = app.screen
        await loaded(pilot, screen, "fixture")
        await pilot.press("g")
        await filter_and_pick_all(pilot, screen, "z0")
        picked = dict(screen.picked)
        assert {r.batch for r in picked.values()} == {"fixture-b1", "fixture-b2"}
        await pilot.press("c")
        assert await wait_for(pilot, lambda: getattr(app.screen, "groups", None), timeout=60)
        await pilot.press("e")
        assert await wait_for(pilot, lambda: list((tui_env / "reports").glob("picked-*/report.md")), timeout=240)
        report = next((tui_env / "reports").glob("picked-*/report.md"))
        runs_csv = (report.parent / "runs.csv").read_text()
        for rid in picked:
            assert rid in runs_csv
        assert "z1-r0" not in runs_csv
