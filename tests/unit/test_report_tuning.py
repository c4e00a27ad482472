"""The report's time-model sections: "Tuning" (a search's outcome) and "Step time: predicted vs measured".

The search's record is read back from a file or an MLflow artifact: it is
fuzzed as untrusted input (never a traceback, bounded, escaped). The
predicted-vs-measured table judges each condition with the model calibrated
on the *other* conditions; a table built from the same data must show that.
"""

from __future__ import annotations

import math
from typing import Any

from helpers import fuzz_examples
from hypothesis import given, settings
from hypothesis import strategies as st

from dstui.analysis import time_check
from dstui.analysis.forecast_model import model_shape
from dstui.analysis.rundata import RunData
from dstui.analysis.time_model import cpu_hardware, terms
from dstui.analysis.tuning import MAX_ROWS, summary_of
from dstui.report.charts_tuning import predicted_vs_measured_figure
from dstui.report.mdformat import neutralize, problems
from dstui.report.sections.tuning import image_line, markdown
from dstui.spec.settings import Settings


def doc(**over: Any) -> dict[str, Any]:
    ranking = [
        {"candidate": "z1-mb4-ga1", "predicted_s": 0.030, "predicted_log_sd": 0.5, "measured_s": 0.040,
         "measured_half_s": 0.002, "timed_steps": 30, "tokens_per_s": 12800.0, "mem_peak": 5.1e8, "error_pct": -25.0,
         "outcome": "ranked (interval tight)", "wall_s": 48.0, "winner": True},
        {"candidate": "z3-mb4-ga1", "predicted_s": 0.25, "predicted_log_sd": 0.9, "measured_s": 3.9, "measured_half_s": 0.9,
         "timed_steps": 4, "error_pct": -93.6, "outcome": "ranked (slower than the best)", "wall_s": 70.0},
    ]  # fmt: skip
    base = {"experiment": "t", "candidates": 12, "winner": "z1-mb4-ga1", "stop_reason": "no remaining candidate can beat",
            "ranking": ranking, "left_out": [{"candidate": "z0-offoptimizer-mb1-ga4", "reason": "optimizer offload needs ZeRO 1-3"}],
            "not_probed": [{"candidate": "z3-mb1-ga4", "predicted_s": 15.0, "optimistic_s": 10.0}],
            "cost": {"probes": 2, "probe_wall_s": 118.0, "gpu_s": 0.0, "search_wall_s": 130.0, "budget_s": 900.0},
            "model": {"source": "fit on 2 runs", "model_sd": 0.1}, "winner_spec": "/x/winner.yaml"}  # fmt: skip
    return {**base, **over}


def test_the_section_says_the_answer_with_its_numbers_and_what_it_cost() -> None:
    md = markdown(summary_of(doc()), image_line("tuning.png"))
    assert md.startswith("## Tuning")
    assert "Winner: **z1-mb4-ga1**, 40.00 ± 2.000 ms per optimizer step, 12,800 tokens/s; 2 probes of 12 candidates" in md
    assert "(1 not probed: predicted not to win; 1 left out)" in md
    assert "off by 59.3% (median) and 93.6% at worst" in md
    assert "2 probes, 118 s of probe wall time, launch to exit (CPU ranks: no GPU time); 130 s for the whole search" in md
    assert "| optimizer offload needs ZeRO 1-3 | 1 | z0-offoptimizer-mb1-ga4 |" in md
    assert "![predicted vs measured step time per probe](tuning.png)" in md
    assert "| 30.00 \\[13.18, 68.29\\] | 40.00 ± 2.000 | -25.0% |" in md  # predicted with its 90% interval, measured with its 95%


def test_hostile_names_cannot_make_markup() -> None:
    bad = "<script>x</script>](javascript:alert(1)) | `"
    d = doc(stop_reason=bad, left_out=[{"candidate": bad, "reason": bad}])
    d["ranking"][0]["candidate"] = bad
    md = markdown(summary_of(d))
    assert not problems(md) and neutralize(md) == md  # no live HTML, no link: every name escaped
    assert "\\<script>" in md and "\\](javascript" in md


@settings(max_examples=fuzz_examples(200), deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=30),
                    lambda kids: st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=15), kids, max_size=6),
                    max_leaves=40))  # fmt: skip
def test_any_json_reads_as_a_bounded_summary_never_a_traceback(value: Any) -> None:
    s = summary_of(value)
    assert len(s.ranking) <= MAX_ROWS and all(isinstance(r.candidate, str) for r in s.ranking)
    md = markdown(s)
    assert not problems(md)


def test_any_fields_inside_a_real_shape_are_survived() -> None:
    d = doc()
    d["ranking"] += [{"candidate": "x", "predicted_s": "fast", "measured_s": math.inf, "timed_steps": "9",
                      "winner": "yes"}, "not a row", {"no": "name"}]  # fmt: skip
    d["ranking"] += [{"candidate": f"c{i}"} for i in range(MAX_ROWS + 5)]
    s = summary_of(d)
    assert len(s.ranking) == MAX_ROWS - 2  # no row past the bound is read; of those within it, two are not probes
    odd = next(r for r in s.ranking if r.candidate == "x")
    assert odd.predicted_s is None and odd.measured_s is None and odd.timed_steps == 0 and not odd.winner
    assert s.dropped == 2 + 10  # the two that are not probes, and the 10 past the bound
    assert "entries of the search's record were not readable" in markdown(s)


def test_the_chart_is_log_log_equal_and_a_decade_wide() -> None:
    fig = predicted_vs_measured_figure(summary_of(doc()))
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax.get_xlim() == ax.get_ylim()
    lo, hi = ax.get_xlim()
    assert hi / lo >= 10 and lo < 0.03 and hi > 3.9  # seconds (the largest is 3.9 s): every point inside
    assert predicted_vs_measured_figure(summary_of(doc(ranking=[]))) is None


def _run(cond: str, z: int, mb: int, ga: int, seconds: float) -> RunData:
    s = Settings(model="tiny-llama", zero_stage=z, micro_batch=mb, grad_accum=ga, gpus=2, seq_length=64)
    params = {k: str(v) for k, v in s.model_dump(mode="json").items() if not isinstance(v, (dict, list)) and v is not None}
    return RunData(run_id=cond, run_name=cond, experiment_id="1", condition=cond, revision="installed", repeat=0,
                   kind="train", status="done", reason="", mlflow_status="FINISHED", start_time=0, params=params,
                   tags={"dstui.device": "cpu", "dstui.hostname": "box"}, label=cond,
                   metrics={"summary.iter_time_mean": seconds, "summary.iter_time_std": 0.0})  # fmt: skip


def test_each_condition_is_predicted_by_the_others_not_by_itself() -> None:
    """Times made from known factors: leaving a condition out still predicts it (calibrated), and the prior differs."""
    hw, shape = cpu_hardware("box"), model_shape("tiny-llama")
    cfgs = [(z, mb, ga) for z in (1, 2) for mb, ga in ((1, 4), (2, 2), (4, 1))]
    runs = []
    for z, mb, ga in cfgs:
        t = terms(Settings(model="tiny-llama", zero_stage=z, micro_batch=mb, grad_accum=ga, gpus=2, seq_length=64), shape, hw)
        runs.append(_run(f"z{z}-mb{mb}", z, mb, ga, 3.0 * t["collectives"] + 0.5 * t["launch"] + sum(t.values())))
    frame = time_check.time_vs_measured(runs)
    assert len(frame) == 6 and set(frame["source"]) == {"fit on 5 other conditions"}
    assert frame["error_pct"].abs().max() < 15  # the machine's factors, learnt from the other five
    assert (frame["prior_s"] != frame["predicted_s"]).all()
    summary = time_check.error_summary(frame)
    assert summary["conditions"] == 6 and summary["worst_pct"] >= summary["median_pct"]
    alone = time_check.time_vs_measured(runs[:1])
    assert alone["source"][0] == "prior (no other condition)"
