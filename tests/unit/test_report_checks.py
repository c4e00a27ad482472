"""Report sections of issue 19 over a real MLflow store, each figure recomputed here from the known inputs.

Revisions (ratio, Fieller interval, p-value, warning, chart), verify runs
(first diverging step, worst tensors, per-step chart), Ulysses sp-check,
GPU power / driver-seen memory, the default parity tolerance, imported seed
logs (version, compile time, best loss, alloc_mem, warm-up sentence),
`kind: command` runs, and `dstui compare` without a usable baseline.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats
from test_import import make_steps, write_log
from test_report import BATCH, EXP, STEPS, log_run, losses, make_parent, store  # noqa: F401

from dstui.core.errors import DstuiError
from dstui.usecases.report import export_report

GIB = 1024**3


def _fieller(a: list[float], b: list[float]) -> tuple[float, float]:
    """Fieller's 95% interval solved with numpy (independent of dstui.analysis.intervals)."""
    am, bm = np.mean(a), np.mean(b)
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    r = am / bm
    df = (va + r**2 * vb) ** 2 / (va**2 / (len(a) - 1) + r**4 * vb**2 / (len(b) - 1))
    t = stats.t.ppf(0.975, df)
    lo, hi = sorted(np.roots([bm**2 - t**2 * vb, -2 * am * bm, am**2 - t**2 * va]).real)
    return float(lo), float(hi)


def test_revision_section_matches_compare(store: tuple[Any, str, str], tmp_path: Path) -> None:  # noqa: F811
    client, exp_id, _ = store
    parent = make_parent(client, exp_id, BATCH)
    rng = np.random.default_rng(3)
    post: dict[str, list[float]] = {"v1": [], "v2": []}
    for rev, level, n in (("v1", 0.50, 3), ("v2", 0.40, 2)):
        for rep in range(n):
            it = [(s, 2.5 if s <= 2 else level + float(rng.normal(0, 0.01))) for s in STEPS]
            post[rev].append(float(np.mean([v for s, v in it if s > 2])))
            log_run(client, exp_id, parent, condition="z1", revision=rev, repeat=rep,
                    history={"iter_time": it, "loss": losses(0.0)})
    out = tmp_path / "rev"
    md = export_report(EXP, out).read_text()
    ratio = np.mean(post["v2"]) / np.mean(post["v1"])
    lo, hi = _fieller(post["v2"], post["v1"])
    p = stats.ttest_ind(post["v2"], post["v1"], equal_var=False).pvalue
    assert "## Revisions against the baseline revision" in md
    assert "| z1 | v2 | 2/3 |" in md
    assert f"| {ratio:.3f} | [{lo:.3f}, {hi:.3f}] | {p:.3g} |" in md, md
    assert "**Warning: too few repeats** for z1 / v2" in md
    assert "(revisions.png)" in md and (out / "revisions.png").stat().st_size > 5000
    # the same numbers as `dstui compare` prints
    from dstui.commands import compare as cmd
    from dstui.usecases.results import compare_revisions

    comps = compare_revisions(EXP, None, "v1").comparisons
    assert comps[0].ratio_ci == pytest.approx((lo, hi), rel=1e-9)
    assert f"[{lo:.3f}, {hi:.3f}]" in cmd.format_table(comps)


def test_compare_without_usable_baseline_exits_non_zero(store: tuple[Any, str, str]) -> None:  # noqa: F811
    client, exp_id, _ = store
    parent = make_parent(client, exp_id, BATCH)
    log_run(client, exp_id, parent, condition="z1", revision="stable", status="failed", reason="exit code 1")
    log_run(client, exp_id, parent, condition="z1", revision="main", history={"iter_time": [(s, 0.1) for s in STEPS]})
    from dstui.cli import main

    with pytest.raises(DstuiError, match="no usable baseline: none of the 1 run"):
        from dstui.commands import compare as cmd

        cmd.run(argparse.Namespace(experiment=EXP, baseline="stable", batch=None, loss_tol=1e-3, json=False))
    assert main(["compare", "--experiment", EXP, "--baseline", "stable"]) == 2


def test_verify_only_experiment(store: tuple[Any, str, str], tmp_path: Path) -> None:  # noqa: F811
    client, exp_id, _ = store
    parent = make_parent(client, exp_id, BATCH)
    loss_d = [(s, 1e-7 if s < 5 else 1e-2 * s) for s in STEPS]
    grad_d = [(s, 1e-6 if s < 5 else 0.5) for s in STEPS]
    within = [(s, 1.0 if s < 5 else 0.0) for s in STEPS]
    worst = [{"name": "model.layers.0.mlp.up_proj.weight", "kind": "grad", "max_abs_diff": 0.5},
             {"name": "model.embed_tokens.weight", "kind": "param", "max_abs_diff": 0.75}]
    log_run(client, exp_id, parent, condition="verify-z3", kind="verify",
            tags={"dstui.verdict": "FAIL", "dstui.worst": json.dumps(worst)},
            params={"rtol": 1e-5, "atol": 1e-4},
            history={"loss": losses(0.0), "iter_time": [(s, 0.2) for s in STEPS], "loss_abs_diff": loss_d,
                     "grad_max_abs_diff": grad_d, "within_tol": within, "mem_peak": [(s, 2 * GIB) for s in STEPS]},
            metrics={"summary.first_diverging_step": 5})
    out = tmp_path / "ver"
    md = export_report(EXP, out).read_text()
    assert "No loss history was recorded" not in md and "(loss.png)" in md
    assert "No memory readings" not in md and "| verify-z3 | 2.000 |" in md
    assert "| verify-z3-r0 | verify-z3 | done | **FAIL** | 5 |" in md
    # worst first: the param tensor with the larger difference
    assert "param `model.embed_tokens.weight` (7.500e-01), grad `model.layers.0.mlp.up_proj.weight`" in md
    assert "rtol 1.000e-05, atol 1.000e-04" in md
    assert "(verify_steps.png)" in md and (out / "verify_steps.png").stat().st_size > 5000


def test_sp_check_power_memory_and_command_runs(store: tuple[Any, str, str], tmp_path: Path) -> None:  # noqa: F811
    from mlflow.entities import Metric

    client, exp_id, _ = store
    parent = make_parent(client, exp_id, BATCH)
    rid = log_run(client, exp_id, parent, condition="ulysses", params={"sp_check": True, "sequence_parallel": 2,
                                                                     "sp_mode": "deepcompile"},
                  tags={"dstui.verdict": "PASS"}, history={"iter_time": [(s, 0.3) for s in STEPS]})
    ts = int(time.time() * 1000)
    power0, power1, mem0 = [100.0, 200.0, 300.0], [200.0, 200.0], [1 * GIB, 3 * GIB]
    client.log_batch(rid, metrics=[Metric("system/box1/gpu0_power_w", v, ts + i, i) for i, v in enumerate(power0)]
                     + [Metric("system/box1/gpu1_power_w", v, ts + i, i) for i, v in enumerate(power1)]
                     + [Metric("system/box1/gpu0_mem_used_bytes", v, ts + i, i) for i, v in enumerate(mem0)])
    log_run(client, exp_id, parent, condition="own-script", kind="command",
            history={"iter_time": [(s, 0.5) for s in STEPS]})
    md = export_report(EXP, tmp_path / "sp").read_text()
    assert "## Sequence parallelism" in md and "| `ulysses-r0` | ulysses | Ulysses DeepCompile | 2 x 1 |" in md
    mean_power = (np.mean(power0) + np.mean(power1)) / 2
    assert f"| ulysses | {mean_power:.1f} | {max(power0):.1f} | {3.0:.3f} GiB |" in md
    # kind: command: no tokens/s made up from dstui's default micro batch x sequence length
    data = json.loads((tmp_path / "sp" / "data.json").read_text())
    cmd_cond = next(c for c in data["conditions"] if c["condition"] == "own-script")
    assert cmd_cond["tokens_per_s"] is None
    # and its training settings (dstui's defaults, not what the command ran) are unknown: never claimed as
    # the command's, never a difference either
    assert "| model | `tiny-llama` (not recorded by 1 of 2 runs) |" in md
    assert "| model | `tiny-llama` |" not in md


def test_default_tolerance_from_dtype_and_noise(store: tuple[Any, str, str], tmp_path: Path) -> None:  # noqa: F811
    client, exp_id, _ = store
    parent = make_parent(client, exp_id, BATCH)
    base, other = losses(0.0), losses(0.06)  # a bf16 cross-stage gap: 0.06
    log_run(client, exp_id, parent, condition="z1", params={"dtype": "bf16"}, history={"loss": base})
    log_run(client, exp_id, parent, condition="z3", params={"dtype": "bf16"}, history={"loss": other})
    md = export_report(EXP, tmp_path / "bf16").read_text()
    level = np.median([np.median(np.abs([v for _, v in base])), np.median(np.abs([v for _, v in other]))])
    tol = 32 * 2**-8 * level
    assert f"tolerance {tol:g} on the absolute loss difference (tolerance: bf16: 32 ulp" in md
    assert "| z3 | z1 | 12 |" in md and "**PASS**" in md
    # noise: two repeats of the baseline 0.2 apart at one step -> 3 x 0.2 beats the dtype's figure
    noisy = [(s, v + (0.2 if s == 3 else 0.0)) for s, v in base]
    log_run(client, exp_id, parent, condition="z1", repeat=1, params={"dtype": "bf16"}, history={"loss": noisy})
    md = export_report(EXP, tmp_path / "noise").read_text()
    assert "tolerance 0.6 on the absolute loss difference (tolerance: run-to-run noise: 3 x" in md
    # given on the command line: said so
    md = export_report(EXP, tmp_path / "given", tolerance=1e-3).read_text()
    assert "tolerance 0.001 on the absolute loss difference (tolerance: given)" in md


def test_imported_log_version_compile_best_loss_alloc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, empty_db: Path) -> None:
    import shutil

    from dstui.importer.seedlogs import import_dir

    shutil.copy(empty_db, tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("DSTUI_HOME", str(tmp_path))
    root = tmp_path / "logs"
    root.mkdir()
    steps = make_steps(12, 5, interval=40)
    summary = ("meta-llama/Meta-Llama-3-8B ds=True np=8 batch_size=1 seq=512 zero_stage=3 acc=4 ac=False "
               "compile=True backend=inductor deepcompile=True passes=None compile_time=58.25 "
               "iteration time: 0.4782 alloc_mem: 28307113472 peak_mem: 50064946688")
    write_log(root / "z3-dc.log", steps, summary=summary, garbage=False, zero=3,
              tail=[])
    text = (root / "z3-dc.log").read_text()
    (root / "z3-dc.log").write_text(
        "[2025-06-17 03:51:21,001] [INFO] [logging.py:107:log_dist] [Rank 0] DeepSpeed info: "
        "version=0.17.1+e440506b, git-hash=e440506b, git-branch=HEAD\n" + text
    )
    result = import_dir(root, "seed1")
    md = export_report("seed1", tmp_path / "rep", batch=result.batch).read_text()
    assert "| deepspeed | 0.17.1+e440506b |" in md and "| deepspeed git sha | e440506b |" in md
    assert "compile time (s)" in md and "| 58.25 |" in md
    best = min(loss for _, loss, _, _, _ in steps)
    assert f"| {best:.6f} |" in md  # best (min) loss of the condition
    alloc_max = max(a for _, _, _, a, _ in steps)
    assert f"{alloc_max / GIB:.3f} GiB" in md
    # warm-up: one logged step excluded (step 40), not "the first 40 optimizer steps"
    assert "optimizer steps up to step 40 of every run" in md and "that is 1 logged step(s) per run" in md
    assert "first 40 optimizer step(s)" not in md


def test_worst_tensors_from_the_runs_metrics_artifact(store: tuple[Any, str, str], tmp_path: Path) -> None:  # noqa: F811
    """The parity runner's summary record (run/metrics.jsonl artifact) carries worst, tolerance and its basis."""
    client, exp_id, _ = store
    parent = make_parent(client, exp_id, BATCH)
    rid = log_run(client, exp_id, parent, condition="verify-z2", kind="verify", tags={"dstui.verdict": "FAIL"},
                  history={"loss_abs_diff": [(s, 1e-3 * s) for s in STEPS]})
    folder = tmp_path / "run"
    folder.mkdir()
    summary = {"type": "summary", "verdict": "FAIL", "first_diverging_step": 7, "tolerance": {"rtol": 0.01, "atol": 0.002},
               "tolerance_basis": "bf16 default", "worst": [{"name": "lm_head.weight", "kind": "grad", "max_abs_diff": 0.03}]}
    (folder / "metrics.jsonl").write_text(json.dumps({"type": "header"}) + "\n" + json.dumps(summary) + "\n")
    client.log_artifacts(rid, str(folder), artifact_path="run")
    md = export_report(EXP, tmp_path / "art").read_text()
    assert "| verify-z2-r0 | verify-z2 | done | **FAIL** | 7 | - | - | grad `lm_head.weight` (3.000e-02) |" in md
    assert "rtol 1.000e-02, atol 2.000e-03; bf16 default" in md


def test_compare_says_which_loss_tolerance(store: tuple[Any, str, str], capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    client, exp_id, _ = store
    parent = make_parent(client, exp_id, BATCH)
    for rev in ("stable", "main"):
        for rep in range(2):
            log_run(client, exp_id, parent, condition="z1", revision=rev, repeat=rep, params={"dtype": "bf16"},
                    history={"iter_time": [(s, 0.1 + 0.01 * rep) for s in STEPS], "loss": losses(0.0)})
    from dstui.commands import compare as cmd

    assert cmd.run(argparse.Namespace(experiment=EXP, baseline="stable", batch=None, loss_tol=None, json=False)) == 0
    level = float(np.median(np.abs([v for _, v in losses(0.0)])))
    out = capsys.readouterr().out
    assert f"loss tolerance {32 * 2**-8 * level:g} (bf16: 32 ulp" in out, out


def test_a_verify_fail_is_a_verdict_with_its_numbers_not_a_run_that_did_not_finish(
    store: tuple[Any, str, str], tmp_path: Path  # noqa: F811
) -> None:
    """Issue 37: the FAIL is listed with its grad-norm ratios, shape and margin; its loss and time still count;
    per-element relative maxima (1e+41 where a baseline element is ~0) are not shown."""
    client, exp_id, _ = store
    parent = make_parent(client, exp_id, BATCH)
    evidence = "verify FAIL at step 1: grad-norm ratio 0.2500, uniform scale 0.2500 = 1/GAS (residual 6.6e-04 of |g|)"
    bad = log_run(client, exp_id, parent, condition="z1-gas", kind="verify", status="failed", reason=evidence,
                  tags={"dstui.verdict": "FAIL", "dstui.evidence": evidence},
                  history={"loss": losses(0.0), "iter_time": [(s, 0.5) for s in STEPS],
                           "grad_norm_ratio": [(s, 0.25 if s == 1 else 1.0) for s in STEPS],
                           "grad_max_rel_diff": [(s, 3e41) for s in STEPS]})
    good = log_run(client, exp_id, parent, condition="z1", kind="verify", tags={"dstui.verdict": "PASS"},
                   history={"loss": losses(0.0), "iter_time": [(s, 0.5) for s in STEPS]})
    for rid, summary in ((bad, {"verdict": "FAIL", "first_diverging_step": 1, "margin_max": 104.2,
                                "grad_norm_ratios": [0.25, 1.0], "grad_shape_kind": "uniform"}),
                         (good, {"verdict": "PASS", "margin_max": 0.24, "grad_norm_ratios": [0.9999, 1.0002],
                                 "grad_shape": "grad-norm ratio 1.0002, rounding-level"})):
        folder = tmp_path / rid
        folder.mkdir()
        (folder / "metrics.jsonl").write_text(json.dumps({"type": "summary", **summary}) + "\n")
        client.log_artifacts(rid, str(folder), artifact_path="run")
    md = export_report(EXP, tmp_path / "art").read_text()
    assert "did not finish" not in md
    assert f"Verification runs: 1 PASS, 1 FAIL (z1-gas-r0: {evidence})." in md.replace("\\", "")
    assert "| z1-gas-r0 | z1-gas | failed | **FAIL** | 1 | 0.2500 to 1.0000 | 104.20 |" in md
    assert "| z1-r0 | z1 | done | **PASS** | - | 0.9999 to 1.0002 | 0.24 |" in md
    assert "3.000e+41" not in md and "max grad |d-g|/|g|" in md.replace("\\", "")
    assert "verify PASS: grad-norm ratio 0.9999..1.0002 over 2 steps, largest difference 0.24x its tolerance" in md
