"""Throughput, TFLOP/s and MFU are total work / total time, not the mean of per-step rates.

A condition whose mean iteration time was 0.264 s at 256 tokens per step was
reported at 3,762 tokens/s (the arithmetic mean of per-step rates) instead of
969. Every rate here is checked against total tokens (or FLOPs) / total time
over the counted steps, computed independently: per run, pooled over repeats,
in the report (markdown, conditions.csv), and in the runner's summary record.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_report import BATCH, EXP, log_run, make_parent, read_csv, store  # noqa: F401

from dstui.analysis.rundata import RunData
from dstui.analysis.stats import compute_run_stats, condition_stats
from dstui.report.charts import fmt_num
from dstui.usecases.report import export_report

REPO = Path(__file__).resolve().parents[2]
FLOPS_PER_STEP_PER_GPU = 3.0e12  # model FLOPs of one step on one rank: tflops_per_gpu = 3 / iter_time
PEAK = 100.0  # TFLOP/s


def _run(times: list[float], tokens: int, warmup: int, name: str = "r0") -> RunData:
    """A run as :func:`dstui.analysis.fetch.run_from_mlflow` builds it, with the per-step rates a runner logs."""
    steps = np.arange(1, len(times) + 1)
    t = np.asarray(times, dtype=float)
    tflops = FLOPS_PER_STEP_PER_GPU / t / 1e12
    r = RunData(
        run_id=name, run_name=name, experiment_id="1", condition="c", revision="installed", repeat=0, kind="train",
        status="done", reason="", mlflow_status="FINISHED", start_time=None,
        params={"tokens_per_step": str(tokens), "warmup_steps": str(warmup)}, tags={}, metrics={},
        history={"iter_time": (steps, t), "tokens_per_s": (steps, tokens / t),
                 "tflops_per_gpu": (steps, tflops), "mfu": (steps, tflops / PEAK)},
    )
    r.label = "c"
    r.stats = compute_run_stats(r)
    return r


times_st = st.lists(st.floats(min_value=1e-3, max_value=5.0, allow_nan=False), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(times=times_st, tokens=st.integers(1, 1 << 20), warmup=st.integers(0, 3))
def test_run_rate_is_total_tokens_over_total_time(times: list[float], tokens: int, warmup: int) -> None:
    r = _run(times, tokens, warmup)
    counted = times[warmup:] or times  # a run shorter than its warm-up: every step
    total_time = sum(counted)
    assert r.stats["tokens_per_s_mean"] == pytest.approx(tokens * len(counted) / total_time, rel=1e-9)
    flops = FLOPS_PER_STEP_PER_GPU * len(counted) / 1e12
    assert r.stats["tflops_per_gpu_mean"] == pytest.approx(flops / total_time, rel=1e-9)
    assert r.stats["mfu_mean"] == pytest.approx(flops / total_time / PEAK, rel=1e-9)
    # the same as tokens per step / mean iteration time, which the report shows beside it
    assert r.stats["tokens_per_s_mean"] == pytest.approx(tokens / r.stats["iter_time_mean"], rel=1e-9)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(repeats=st.lists(times_st, min_size=1, max_size=4), tokens=st.integers(1, 1 << 20))
def test_condition_rate_pools_the_repeats_steps(repeats: list[list[float]], tokens: int) -> None:
    """Repeats of different lengths and speeds: the condition's rate is over all their counted steps together."""
    runs = [_run(times, tokens, 1, name=f"r{i}") for i, times in enumerate(repeats)]
    (cs,) = condition_stats(runs)
    counted = [t for times in repeats for t in (times[1:] or times)]
    assert cs.tokens_per_s_mean == pytest.approx(tokens * len(counted) / sum(counted), rel=1e-9)
    assert cs.tokens_per_s_mean == pytest.approx(tokens / cs.iter_time_mean, rel=1e-9)
    flops = FLOPS_PER_STEP_PER_GPU * len(counted) / 1e12
    assert cs.tflops_per_gpu_mean == pytest.approx(flops / sum(counted), rel=1e-9)
    assert cs.mfu_mean == pytest.approx(flops / sum(counted) / PEAK, rel=1e-9)


def test_report_throughput_agrees_with_mean_iteration_time(store: tuple[Any, str, str], tmp_path: Path) -> None:  # noqa: F811
    """The reviewer's case: uneven steps at 256 tokens/step; the report said ~6,700 tokens/s where 985 is right."""
    client, exp_id, _ = store
    parent = make_parent(client, exp_id, BATCH)
    tokens = 2 * 64 * 2  # micro_batch x seq_length x gpus of log_run's params
    it = [(s, 1.0 if s <= 2 else (0.5 if s % 2 else 0.02)) for s in range(1, 13)]  # warm-up 2
    log_run(client, exp_id, parent, condition="z0", history={
        "iter_time": it,
        "tokens_per_s": [(s, tokens / v) for s, v in it],
        "tflops_per_gpu": [(s, 3.0 / v) for s, v in it],
        "mfu": [(s, 3.0 / v / PEAK) for s, v in it],
    })
    out = tmp_path / "rep"
    md = export_report(EXP, out, log_artifact=False).read_text()
    post = np.array([v for s, v in it if s > 2])
    expected = tokens * len(post) / post.sum()  # 985 tokens/s; the mean of rates is 6,656
    row = read_csv(out / "conditions.csv")[0]
    assert float(row["tokens_per_s"]) == pytest.approx(expected, rel=1e-9)
    assert float(row["tflops_per_gpu"]) == pytest.approx(3.0 * len(post) / post.sum(), rel=1e-9)
    assert float(row["mfu"]) == pytest.approx(3.0 * len(post) / post.sum() / PEAK, rel=1e-9)
    assert f"| z0 | {fmt_num(expected)} | {fmt_num(3.0 * len(post) / post.sum())} |" in md, md
    data = json.loads((out / "data.json").read_text())
    assert data["runs"][0]["stats"]["tokens_per_s_mean"] == pytest.approx(expected, rel=1e-9)


@settings(max_examples=100, deadline=None)
@given(times=st.lists(st.floats(min_value=1e-3, max_value=5.0, allow_nan=False), min_size=2, max_size=40),
       tokens=st.integers(1, 1 << 20), warmup=st.integers(0, 3))
def test_runner_summary_rates_are_total_work_over_total_time(times: list[float], tokens: int, warmup: int) -> None:
    """runners/loop.py's summary record (MLflow's summary.* metrics) agrees with the report's figures."""
    sys.path.insert(0, str(REPO / "runners"))
    from loop import timing_summary

    s = timing_summary(times, warmup, tokens, lambda t: FLOPS_PER_STEP_PER_GPU / t / 1e12, PEAK)
    counted = times[warmup:] or times
    assert s["tokens_per_s_mean"] == pytest.approx(tokens * len(counted) / sum(counted), rel=1e-9)
    assert s["tflops_per_gpu_mean"] == pytest.approx(FLOPS_PER_STEP_PER_GPU * len(counted) / sum(counted) / 1e12, rel=1e-9)
    assert s["mfu_mean"] == pytest.approx(s["tflops_per_gpu_mean"] / PEAK, rel=1e-12)
    r = _run(times, tokens, warmup)
    assert s["tokens_per_s_mean"] == pytest.approx(r.stats["tokens_per_s_mean"], rel=1e-9)
    assert s["iter_time_mean"] == pytest.approx(r.stats["iter_time_mean"], rel=1e-9)
