"""Results screen: per-condition figures from MLflow, baseline, sort/filter, export, mlflow ui."""

from __future__ import annotations

import sys
import types

import pytest
from helpers import HEAVY
from textual.widgets import Input, Static
from tui_helpers import make_store, wait_for

from dstui.tui.app import DstuiApp
from dstui.tui.screens.results import ResultsScreen
from dstui.tui.screens.text import TextScreen

pytestmark = pytest.mark.anyio

async def open_results(pilot, app) -> ResultsScreen:  # noqa: ANN001
    await pilot.press("3")
    screen = app.screen
    assert isinstance(screen, ResultsScreen)
    assert await wait_for(pilot, lambda: screen.results is not None, timeout=120)
    await pilot.pause()
    return screen


@HEAVY
async def test_results_conditions_baseline_sort_filter(tui_env):  # noqa: F811
    make_store()
    app = DstuiApp(supervise=False)
    async with app.run_test(size=(120, 30)) as pilot:
        screen = await open_results(pilot, app)
        res = screen.results
        assert [c.label for c in res.conditions] == ["z0", "z1", "z2"]
        z0 = res.conditions[0]
        assert z0.runs == "2/2"
        assert z0.iter_mean == pytest.approx(0.115)  # warm-up (2 steps of 9 s) excluded
        assert z0.final_loss == pytest.approx(3.0)
        assert screen.baseline == "z0"
        rows = screen.rows()
        assert screen._delta(rows[1]) == pytest.approx(0.01)
        # make z2 the baseline: z0 is then +0.02
        table = screen.query_one("#results")
        table.focus()
        table.move_cursor(row=2)
        await pilot.press("b")
        await pilot.pause()
        assert screen.baseline == "z2"
        assert screen._delta(screen.rows()[0]) == pytest.approx(0.02)
        # sort by iteration time, descending
        screen.sort_col, screen.sort_reverse = 2, True
        screen.fill()
        assert [r.label for r in screen.rows()] == ["z2", "z1", "z0"]
        # per-run rows and a filter
        await pilot.press("g")
        assert len(screen.rows()) == 6
        await pilot.press("slash")
        await pilot.press("z", "1")
        await pilot.pause()
        assert sorted(r.run_name for r in screen.rows()) == ["z1-r0", "z1-r1"]
        assert screen.query_one("#filter", Input).value == "z1"


async def test_results_export_and_mlflow_ui(tui_env, monkeypatch):  # noqa: F811
    make_store()
    calls = []
    fake = types.ModuleType("dstui.usecases.report")

    def export(experiment, out_dir, *, batch=None, runs=None, baseline=None, **kw):  # noqa: ANN001, ANN003
        out_dir.mkdir(parents=True)
        calls.append((experiment, batch, baseline))
        (out_dir / "report.md").write_text("# report\n")
        return types.SimpleNamespace(report=out_dir / "report.md", where=lambda: "logged to MLflow nowhere (test)")

    fake.export = export
    monkeypatch.setitem(sys.modules, "dstui.usecases.report", fake)
    import dstui.usecases

    monkeypatch.setattr(dstui.usecases, "report", fake, raising=False)
    app = DstuiApp(supervise=False)
    async with app.run_test(size=(120, 30)) as pilot:
        screen = await open_results(pilot, app)
        screen.query_one("#results").focus()
        await pilot.press("e")
        assert await wait_for(pilot, lambda: calls, timeout=30)
        assert calls == [("fixture", None, "z0")]
        assert list((tui_env / "reports").glob("fixture-*/report.md"))
        await pilot.press("u")
        await pilot.pause()
        assert isinstance(app.screen, TextScreen)
        body = str(app.screen.query_one("#text-body", Static).render())
        assert "mlflow ui --backend-store-uri sqlite:///" in body and "--host 127.0.0.1" in body


@HEAVY
async def test_results_without_report_module(tui_env, monkeypatch):  # noqa: F811
    make_store()
    monkeypatch.setitem(sys.modules, "dstui.usecases.report", None)  # import fails
    import dstui.usecases

    monkeypatch.delattr(dstui.usecases, "report", raising=False)
    app = DstuiApp(supervise=False)
    async with app.run_test(size=(120, 30)) as pilot:
        screen = await open_results(pilot, app)
        screen.query_one("#results").focus()
        await pilot.press("e")
        ok = await wait_for(pilot, lambda: any("not available" in n.message for n in app._notifications), timeout=30)
        assert ok


async def test_results_ratio_interval_like_reports(tui_env):  # noqa: F811
    """The time / base column: Fieller's interval over per-run means, solved here with numpy."""
    import numpy as np
    from scipy import stats

    from dstui.tracking import client as tracking

    make_store()
    c = tracking.client()
    exp = tracking.ensure_experiment(c, "fixture")
    parent = tracking.find_run(c, exp, {"dstui.role": "batch", "dstui.batch": "fixture-b1"}).info.run_id
    extra = {"z0": 0.125, "z1": 0.19}  # a third repeat each, different from the first two
    for cond, level in extra.items():
        rid = tracking.create_run(c, exp, f"{cond}-r2", parent_id=parent, tags={
            "dstui.role": "run", "dstui.batch": "fixture-b1", "dstui.condition": cond, "dstui.repeat": 2,
            "dstui.kind": "train", "dstui.status": "done", "dstui.order": 10,
        })  # fmt: skip
        tracking.log_params(c, rid, {"warmup_steps": 2})
        tracking.log_metrics(c, rid, [("iter_time", v, 1000 + s, s) for s, v in enumerate([9.0, 9.0, level, level], 1)])
        tracking.finish(c, rid, "FINISHED")
    a = [0.215, 0.215, 0.19]  # z1 per-run means
    b = [0.115, 0.115, 0.125]  # z0 (baseline)
    am, bm = np.mean(a), np.mean(b)
    va, vb = np.var(a, ddof=1) / 3, np.var(b, ddof=1) / 3
    r = am / bm
    df = (va + r**2 * vb) ** 2 / (va**2 / 2 + r**4 * vb**2 / 2)
    t = stats.t.ppf(0.975, df)
    lo, hi = sorted(np.roots([bm**2 - t**2 * vb, -2 * am * bm, am**2 - t**2 * va]).real)
    app = DstuiApp(supervise=False)
    async with app.run_test(size=(140, 30)) as pilot:
        screen = await open_results(pilot, app)
        assert screen.baseline == "z0"
        z1 = next(r for r in screen.rows() if r.label == "z1")
        assert sorted(z1.run_means) == pytest.approx(sorted(a))
        text = screen._ratio_text(z1)
        assert text.plain == f"{r:.3f} [{lo:.3f}, {hi:.3f}]"
        assert lo > 1 and text.style == "red"  # clearly slower than the baseline
