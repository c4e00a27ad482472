"""Report wording never claims more than its numbers (issue 38.4): a verdict carries the figures that decided it.

* "Fastest" only where the 95% interval of the leader's speed ratio over every other condition
  lies above 1, and then with those intervals; otherwise the means, unranked, and why;
* no best final loss across conditions whose settings change the numerics by design;
* on CPU the Memory section names what was measured (the process's RSS), never tensor memory;
* a report over several batches is logged to the parent run of every batch it covers, and says so.

The speed rule is a property over random timings (runs in memory, the report's own
:func:`~dstui.analysis.results.compute`); the rest are reports from a real MLflow store.
"""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_report import BATCH, EXP, STEPS, log_run, losses, make_parent, mem, store  # noqa: F401 - the store fixture

from dstui.analysis.intervals import fieller_ratio
from dstui.analysis.results import Results, compute
from dstui.analysis.rundata import RunData
from dstui.analysis.stats import compute_run_stats
from dstui.report.context import ReportContext
from dstui.report.sections import overview, quality
from dstui.usecases.report import export, export_report


def timed_run(condition: str, repeat: int, mean_s: float) -> RunData:
    """A finished run whose post-warm-up iterations average ``mean_s`` (small jitter, warm-up 0)."""
    steps = np.arange(1, 9)
    times = mean_s * (1 + 0.001 * np.sin(steps + repeat))
    r = RunData(run_id=f"{condition}-{repeat}", run_name=f"{condition}-r{repeat}", experiment_id="1",
                condition=condition, revision="installed", repeat=repeat, kind="train", status="done", reason="",
                mlflow_status="FINISHED", start_time=repeat, params={"warmup_steps": "0", "zero_stage": condition[1:]},
                tags={"dstui.batch": "b1"}, metrics={}, history={"iter_time": (steps, times)})  # fmt: skip
    r.stats = compute_run_stats(r)
    return r


def context(res: Results) -> ReportContext:
    return ReportContext(**{f.name: getattr(res, f.name) for f in fields(Results)})


# per condition: the per-repeat mean iteration times (ms), 1 to 4 repeats
timings = st.lists(st.lists(st.floats(5.0, 50.0), min_size=1, max_size=4), min_size=2, max_size=4)


@settings(max_examples=80, deadline=None)
@given(timings)
def test_fastest_only_with_bounded_ratios_and_always_with_the_figures(conds: list[list[float]]) -> None:
    runs = [timed_run(f"z{i}", rep, ms / 1000) for i, means in enumerate(conds) for rep, ms in enumerate(means)]
    ctx = context(compute(runs))
    head = overview.speed_headline(ctx)
    assert head is not None
    # the rule, computed here from the per-run means: the best mean's ratio over every other, bounded above 1
    per_run = {c.label: [r.stats["iter_time_mean"] for r in c.runs] for c in ctx.conds}
    lead = min(per_run, key=lambda k: np.mean(per_run[k]))
    intervals = {k: fieller_ratio(v, per_run[lead]) for k, v in per_run.items() if k != lead}
    shown = all(iv.bounded and iv.low > 1.0 for iv in intervals.values())
    assert head.startswith("Fastest: ") == shown, (head, intervals)
    assert ("Fastest" in quality.recommendations(ctx)) == shown
    if shown:  # each other condition's interval is in the sentence
        for k, iv in intervals.items():
            assert f"[{iv.low:.2f}, {iv.high:.2f}] (95% CI, n={iv.n_b} vs {iv.n_a}) the speed of {k}" in head, head
    else:  # every mean is in the sentence, and the pair that is not bounded with its reason
        for c in ctx.conds:
            assert f"{c.label} {ctx.speed(c)}" in head
        assert "the data do not bound the ratio" in head
        assert re.search(r"n=\d, no interval|no interval \(|\[\d+\.\d\d, \d+\.\d\d\]", head), head


def _lrsweep(store: tuple[Any, str, str], *, lr_axis: bool, gap: float = 0.0) -> None:  # noqa: F811
    client, exp_id, _ = store
    parent = make_parent(client, exp_id, BATCH)
    for cond, stage, lr, off in (("z1-a", 1, "0.0001", 0.0), ("z2-a", 2, "0.0001", gap),
                                 ("z1-b", 1, "0.001" if lr_axis else "0.0001", 0.2)):  # fmt: skip
        log_run(client, exp_id, parent, condition=cond, params={"zero_stage": stage, "lr": lr},
                history={"iter_time": [(s, 0.01 * stage) for s in STEPS], "loss": losses(off), "mem_peak": mem(1.0)})


def test_no_best_loss_across_conditions_that_differ_by_design(store: tuple[Any, str, str], tmp_path: Path) -> None:  # noqa: F811
    _lrsweep(store, lr_axis=True)
    md = export_report(EXP, tmp_path / "r", batch=BATCH, baseline="z1-a", log_artifact=False).read_text()
    assert "Best final loss" not in md and "Lowest final loss" not in md
    assert "- **Final loss**: not ranked: the conditions differ in `lr`, which changes the numerics by design" in md


def test_lowest_loss_only_beyond_the_tolerance_and_with_both_numbers(store: tuple[Any, str, str], tmp_path: Path) -> None:  # noqa: F811
    _lrsweep(store, lr_axis=False)  # all lr 1e-4: comparable; z1-b ends 0.2 higher
    md = export_report(EXP, tmp_path / "r", batch=BATCH, baseline="z1-a", tolerance=1e-3, log_artifact=False).read_text()
    low, high = losses(0.0)[-1][1], losses(0.2)[-1][1]
    assert (f"- **Lowest final loss**: z1-a ({low:.6f}); highest z1-b ({high:.6f}): {high - low:.3g} apart, beyond "
            "the tolerance 0.001") in md  # fmt: skip


def test_equal_final_losses_name_no_best(store: tuple[Any, str, str], tmp_path: Path) -> None:  # noqa: F811
    client, exp_id, _ = store
    parent = make_parent(client, exp_id, BATCH)
    for cond, stage in (("z1", 1), ("z2", 2)):
        log_run(client, exp_id, parent, condition=cond, params={"zero_stage": stage},
                history={"iter_time": [(s, 0.01) for s in STEPS], "loss": losses(0.0)})
    md = export_report(EXP, tmp_path / "r", batch=BATCH, log_artifact=False).read_text()
    final = losses(0.0)[-1][1]
    assert f"- **Final loss**: every condition ends within 0.001 of each other ({final:.6f} to {final:.6f})" in md
    assert "Lowest final loss" not in md and "Best final loss" not in md


def test_cpu_memory_is_named_for_what_was_measured(store: tuple[Any, str, str], tmp_path: Path) -> None:  # noqa: F811
    _lrsweep(store, lr_axis=True)  # log_run's runs report device cpu
    md = export_report(EXP, tmp_path / "r", batch=BATCH, log_artifact=False).read_text()
    memory = md[md.index("## Memory\n"):md.index("## Memory: forecast")]
    assert "live tensors" not in memory and "allocated (GiB)" not in memory
    assert "| condition | peak RSS (GiB) | vs baseline | RSS at a step (GiB) |" in memory
    assert "resident memory (RSS) of rank 0's process, not the memory of tensors" in memory


def test_gpu_memory_keeps_the_allocator_wording(store: tuple[Any, str, str], tmp_path: Path) -> None:  # noqa: F811
    client, exp_id, _ = store
    parent = make_parent(client, exp_id, BATCH)
    log_run(client, exp_id, parent, condition="z1", tags={"dstui.device": "cuda", "dstui.gpu_name": "H100"},
            history={"iter_time": [(s, 0.01) for s in STEPS], "mem_peak": mem(2.0), "mem_alloc": mem(1.0)})
    md = export_report(EXP, tmp_path / "r", batch=BATCH, log_artifact=False).read_text()
    assert "| condition | peak (GiB) | vs baseline | allocated (GiB) |" in md
    assert "`torch.cuda.memory_allocated`, the memory held by live tensors" in md


def test_a_report_over_several_batches_is_logged_to_every_parent(store: tuple[Any, str, str], tmp_path: Path,  # noqa: F811
                                                                 capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    client, exp_id, _ = store
    parents = {}
    for b in ("cmp-20260101-000000", "cmp-20260102-000000"):
        parents[b] = make_parent(client, exp_id, b)
        log_run(client, exp_id, parents[b], condition="z1", tags={"dstui.batch": b},
                history={"iter_time": [(s, 0.01) for s in STEPS]})
    orphan = "import-old-logs"  # runs whose batch has no parent run in MLflow
    log_run(client, exp_id, parents["cmp-20260101-000000"], condition="z9", tags={"dstui.batch": orphan},
            history={"iter_time": [(s, 0.01) for s in STEPS]})
    done = export(EXP, tmp_path / "all")
    assert done.logged_to == {b: parents[b] for b in parents}
    assert done.not_logged == [orphan]
    for pid in parents.values():
        assert "report/report.md" in {a.path for a in client.list_artifacts(pid, "report")}
        assert "report.html" in {a.path for a in client.list_artifacts(pid)}
    md = done.report.read_text()
    assert all(f"`{b}`: `{pid}`" in md for b, pid in parents.items())  # the report says where it went
    assert done.where() == ("logged to MLflow as artifact 'report' of parent run {} of batch cmp-20260101-000000; "
                            "parent run {} of batch cmp-20260102-000000 (no parent run for batch import-old-logs)"
                            ).format(*parents.values())  # fmt: skip
    # the CLI says it on stderr and in --json
    from dstui.cli import main

    assert main(["report", "-e", EXP, "-o", str(tmp_path / "cli"), "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["logged_to"] == parents
    assert out.err.rstrip().splitlines()[-1].endswith(done.where())
