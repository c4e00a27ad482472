"""One metric catalogue: every face reads its names, titles, scales and the one warm-up rule from it."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest

from dstui.analysis.rundata import RunData
from dstui.analysis.stats import post_warmup_mask
from dstui.bisect.measure import run_sample
from dstui.core import metric_catalogue as mc
from dstui.core.rundir import RunDir, merge_status
from dstui.tracking.chart_view import TRAINING
from dstui.tracking.metric_names import mlflow_key
from dstui.tui import results_chart_data, series
from dstui.tui.chart_view import Curve
from dstui.usecases import run_figures

REPO = Path(__file__).resolve().parents[2]


def test_the_live_and_results_charts_follow_the_catalogue() -> None:
    assert mc.names_in(mc.LIVE) == series.STEP_KEYS
    assert set(series.SMOOTHED) == {"loss", "iter_time"}
    assert [k for k, _ in results_chart_data.METRICS] == ["loss", "iter_time", "mem_peak", "tokens_per_s"]
    assert dict(results_chart_data.METRICS)["mem_peak"] == "peak memory"


def test_mlflow_view_names_memory_in_gib() -> None:
    assert TRAINING[:3] == ["loss", "iter_time", "mem_peak_gib"] and "mem_alloc_gib" in TRAINING
    assert [mlflow_key(n) for n in mc.names_in(mc.MLFLOW_VIEW)] == TRAINING


def a_run(steps: list[int], values: list[float]) -> RunData:
    history = {k: (np.array(steps, float), np.array(values)) for k in ("loss", "iter_time", "mem_peak", "tokens_per_s")}
    return RunData(run_id="r", run_name="c-r0", experiment_id="1", condition="c", revision="installed", repeat=0,
                   kind="train", status="done", reason="", mlflow_status="FINISHED", start_time=0,
                   params={"warmup_steps": "2"}, tags={}, metrics={}, history=history)  # fmt: skip


@pytest.mark.parametrize("key", ["loss", "iter_time", "mem_peak", "tokens_per_s"])
def test_one_warmup_rule_for_results_and_live_charts(key: str) -> None:
    """The Results chart's curves skip warm-up in their range exactly where the catalogue says (and so does Live,
    which asks the same function): timings and rates yes, loss and memory no."""
    g = results_chart_data.Group("c", "e", "b", "c", [a_run([1, 2, 3, 4], [9.0, 1.0, 1.0, 1.0])])
    curves: list[Curve] = results_chart_data.curves_for([g], key)
    assert curves and all(c.range_skips_warmup is mc.skips_warmup(key) for c in curves)
    assert g.warmup == 2
    assert mc.skips_warmup(key) is (key in ("iter_time", "tokens_per_s"))


def test_warmup_counts_from_the_first_step_a_run_can_log() -> None:
    assert mc.first_counted_step(1, 2) == 3 and mc.first_counted_step(0, 2) == 2
    assert mc.first_counted_step(5, 2) == 3  # log_interval 5: the first logged step is already past warm-up
    assert post_warmup_mask(np.array([5, 10, 15]), 2).tolist() == [True, True, True]
    for bad in (None, -1, float("nan"), float("inf"), True, "3"):
        assert mc.warmup_count(bad) is None
    assert mc.warmup_count(2.0) == 2 and mc.warmup_count(0) == 0


def test_bisect_times_the_same_steps_as_reports(tmp_path: Path) -> None:
    """A run logging every 2nd step with 3 warm-up steps: steps 2, 4, 6 are logged; 4 onwards count (4 and 6),
    for reports (post_warmup_mask) and bisect alike. Bisect used to count from the first logged step (2 + 3: 6 only)."""
    rd = RunDir(tmp_path / "b" / "r0")
    rd.path.mkdir(parents=True)
    (rd.path / "spec.json").write_text(json.dumps({"settings": {"warmup_steps": 3}}))
    rows = [{"type": "step", "step": s, "iter_time": t, "loss": 1.0} for s, t in ((2, 5.0), (4, 1.0), (6, 2.0))]
    rd.metrics_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    merge_status(rd, {"state": "done", "steps_done": 6, "steps_total": 6})
    steps = np.array([2, 4, 6])
    expected = np.array([5.0, 1.0, 2.0])[post_warmup_mask(steps, 3)].mean()
    assert run_sample(rd, "b")["iter_time_mean"] == pytest.approx(expected) == pytest.approx(1.5)


def test_no_module_spells_its_own_list_of_metric_names() -> None:
    """A tuple or list of three or more catalogue names anywhere in dstui/ but the catalogue is a second list."""
    names = set(mc.BY_NAME)
    found = []
    for p in (REPO / "dstui").rglob("*.py"):
        if p.name == "metric_catalogue.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                spelled = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names]
                if len(spelled) >= 3:
                    found.append(f"{p.relative_to(REPO)}:{node.lineno} {spelled}")
    assert not found, "read dstui.core.metric_catalogue instead:\n" + "\n".join(found)


def test_the_faces_speed_counts_the_same_steps_as_reports() -> None:
    """`dstui status` and the Runs table's mean step time (usecases/run_figures) leave out the steps the
    report leaves out. A program counting steps from 0 with 2 warm-up steps: steps 2 and 3 count (the
    faces used to count from 1 there, step > 2: step 3 alone)."""
    steps = [{"step": s, "iter_time": t, "tokens_per_s": 100.0} for s, t in ((0, 9.0), (1, 9.0), (2, 1.0), (3, 3.0))]
    mask = post_warmup_mask(np.array([0, 1, 2, 3]), 2)
    assert run_figures.mean_of_steps(steps, 2).iter_time == pytest.approx(np.array([9.0, 9.0, 1.0, 3.0])[mask].mean()) == 2.0
    assert run_figures.warmup_of({"warmup_steps": float("nan")}) == 0 and run_figures.warmup_of({"warmup_steps": 3}) == 3
