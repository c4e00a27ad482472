"""Reports from a real MLflow SQLite store, checked against independently computed figures.

The runs are built here with MlflowClient following docs/ARCHITECTURE.md's
layout (parent batch run, nested child runs, tags, params, step metrics), so
every input is known and every figure in report.md / runs.csv / data.json can
be recomputed with plain numpy and compared.
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import HEAVY

from dstui.analysis import fetch
from dstui.analysis.fetch import fetch_histories, fetch_runs
from dstui.analysis.rundata import ReportError
from dstui.report.charts import fmt_num
from dstui.usecases.report import export_report

GB = 1024**3
EXP = "cmp"
BATCH = "cmp-20260101-000000"


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, empty_db: Path) -> tuple[Any, str, str]:
    import shutil

    from mlflow import MlflowClient

    shutil.copy(empty_db, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(uri)
    exp_id = client.create_experiment(EXP, artifact_location=(tmp_path / "artifacts").as_uri())
    return client, exp_id, uri


def make_parent(client: Any, exp_id: str, batch: str) -> str:
    run = client.create_run(exp_id, run_name=batch, tags={"dstui.role": "batch", "dstui.batch": batch, "dstui.spec": "x.yaml"})
    return run.info.run_id


def log_run(
    client: Any,
    exp_id: str,
    parent: str,
    *,
    condition: str,
    repeat: int = 0,
    revision: str = "installed",
    status: str = "done",
    reason: str = "",
    kind: str = "train",
    params: dict[str, Any] | None = None,
    history: dict[str, list[tuple[int, float]]] | None = None,
    tags: dict[str, str] | None = None,
    metrics: dict[str, float] | None = None,
    ds_config: dict[str, Any] | None = None,
) -> str:
    """A child run laid out as the supervisor writes it (``ds_config``: its top-level ds_config.json artifact)."""
    from mlflow.entities import Metric, Param

    name = f"{condition}-r{repeat}" if revision == "installed" else f"{condition}-{revision}-r{repeat}"
    all_tags = {
        "mlflow.parentRunId": parent,
        "dstui.role": "run",
        "dstui.batch": BATCH,
        "dstui.condition": condition,
        "dstui.revision": revision,
        "dstui.repeat": str(repeat),
        "dstui.kind": kind,
        "dstui.status": status,
        "dstui.reason": reason,
        "dstui.hostname": "box1",
        "dstui.device": "cpu",
        "dstui.gpu_name": "",
        "dstui.gpu_count": "0",
        "dstui.version.deepspeed": "0.19.8",
        "dstui.version.torch": "2.11.0",
        "dstui.cmd": f"deepspeed runners/train.py --condition {condition}",
        **(tags or {}),
    }
    run = client.create_run(exp_id, run_name=name, tags=all_tags)
    rid = run.info.run_id
    p = {"model": "tiny-llama", "micro_batch": 2, "grad_accum": 1, "seq_length": 64, "gpus": 2, "warmup_steps": 2,
         "ds.zero_optimization.stage": 1, "ds.train_micro_batch_size_per_gpu": 2}
    p.update(params or {})
    client.log_batch(rid, params=[Param(k, str(v)) for k, v in p.items()])
    ts = int(time.time() * 1000)
    ms = [Metric(k, float(v), ts, s) for k, pts in (history or {}).items() for s, v in pts]
    ms += [Metric(k, float(v), ts, 0) for k, v in (metrics or {}).items()]
    for i in range(0, len(ms), 1000):
        client.log_batch(rid, metrics=ms[i : i + 1000])
    if ds_config is not None:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "ds_config.json").write_text(json.dumps(ds_config))
            client.log_artifact(rid, str(Path(tmp) / "ds_config.json"))
    client.set_terminated(rid, {"done": "FINISHED", "failed": "FAILED", "killed": "KILLED"}.get(status, "FINISHED"))
    return rid


STEPS = list(range(1, 13))  # 12 optimizer steps, warm-up 2


def times(base: float, seed: int, *, outlier_at: int | None = None) -> list[tuple[int, float]]:
    rng = np.random.default_rng(seed)
    out = []
    for s in STEPS:
        v = base * (5.0 if s <= 2 else 1.0) + float(rng.uniform(-0.01, 0.01))
        if s == outlier_at:
            v = base * 10
        out.append((s, round(v, 6)))
    return out


def losses(offset: float, jitter: float = 0.0) -> list[tuple[int, float]]:
    return [(s, 3.0 - 0.1 * s + offset + (jitter if s % 2 else -jitter)) for s in STEPS]


def mem(peak: float) -> list[tuple[int, float]]:
    return [(s, peak * GB * (0.9 + 0.01 * s)) for s in STEPS]


def build_comparison(store: tuple[Any, str, str]) -> dict[str, Any]:
    client, exp_id, _ = store
    parent = make_parent(client, exp_id, BATCH)
    spec = {
        # condition: (iter time, loss offset, peak GB, zero stage)
        "z1": (0.20, 0.0, 2.0, 1),
        "z2": (0.25, 0.0002, 1.5, 2),
        "z3": (0.40, 0.01, 1.0, 3),
    }
    inputs: dict[str, Any] = {"parent": parent, "runs": {}}
    seed = 0
    for repeat in range(2):
        for cond, (t, off, peak, stage) in spec.items():
            seed += 1
            hist = {
                "iter_time": times(t, seed, outlier_at=7 if (cond == "z2" and repeat == 1) else None),
                "loss": losses(off, jitter=0.0001 * repeat),
                "mem_peak": mem(peak),
                "tokens_per_s": [(s, 2 * 64 * 2 / v) for s, v in times(t, seed)],
            }
            rid = log_run(client, exp_id, parent, condition=cond, repeat=repeat, params={"zero_stage": stage}, history=hist,
                          ds_config={"zero_optimization": {"stage": stage}, "train_micro_batch_size_per_gpu": 2})
            inputs["runs"][rid] = (cond, repeat, hist)
    inputs["oom"] = log_run(
        client, exp_id, parent, condition="z0-mb64", status="failed", reason="CUDA out of memory",
        params={"zero_stage": 0, "micro_batch": 64}, history={"loss": [(1, 3.0)]},
    )
    inputs["failed"] = log_run(
        client, exp_id, parent, condition="z3-broken", status="failed", reason="exit code 1",
        params={"zero_stage": 3},
    )
    return inputs


def read_csv(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(path.read_text(encoding="utf-8").splitlines()))


def post(hist: list[tuple[int, float]], warmup: int = 2) -> np.ndarray:
    return np.array([v for s, v in hist if s > warmup])


def test_report_figures_match_independent_computation(store: tuple[Any, str, str], tmp_path: Path) -> None:
    client, _, _ = store
    inputs = build_comparison(store)
    out = tmp_path / "rep"
    report = export_report(EXP, out, batch=BATCH, baseline="z1", tolerance=1e-3)
    md = report.read_text()

    # runs.csv: per-run statistics
    rows = {r["run_id"]: r for r in read_csv(out / "runs.csv")}
    assert len(rows) == 8
    for rid, (_cond, _rep, hist) in inputs["runs"].items():
        it = post(hist["iter_time"])
        assert float(rows[rid]["iter_time_mean"]) == pytest.approx(it.mean(), rel=1e-12)
        assert float(rows[rid]["iter_time_std"]) == pytest.approx(it.std(ddof=1), rel=1e-12)
        assert float(rows[rid]["mem_peak_gb"]) == pytest.approx(max(v for _, v in hist["mem_peak"]) / GB)
        assert float(rows[rid]["final_loss"]) == pytest.approx(hist["loss"][-1][1])
        assert int(rows[rid]["warmup_steps"]) == 2
    assert rows[inputs["oom"]]["status"] == "failed" and rows[inputs["oom"]]["oom"] == "True"
    assert rows[inputs["failed"]]["reason"] == "exit code 1"

    # conditions: pooled post-warm-up iterations of both repeats
    data = json.loads((out / "data.json").read_text())
    conds = {c["label"]: c for c in data["conditions"]}
    expect_mean = {}
    for cond in ("z1", "z2", "z3"):
        pooled = np.concatenate([post(h["iter_time"]) for c, _, h in inputs["runs"].values() if c == cond])
        expect_mean[cond] = pooled.mean()
        assert conds[cond]["iter_time_mean_s"] == pytest.approx(pooled.mean(), rel=1e-12)
        assert conds[cond]["iter_time_std_s"] == pytest.approx(pooled.std(ddof=1), rel=1e-12)
        run_means = [post(h["iter_time"]).mean() for c, _, h in inputs["runs"].values() if c == cond]
        assert conds[cond]["iter_time_repeat_std_s"] == pytest.approx(np.std(run_means, ddof=1), rel=1e-9)
        # the figure as printed in the report (ms: every mean is below 1 s)
        assert fmt_num(pooled.mean() * 1000) in md
    assert conds["z0-mb64"]["oom"] == 1 and conds["z0-mb64"]["usable"] == 0

    # parity and ratios against the baseline
    parity = {p["label"]: p for p in data["parity"]}
    for cond, verdict in (("z2", "PASS"), ("z3", "FAIL")):
        base = np.array([v for _, v in losses(0.0)])  # both repeats' jitter cancels in the mean
        other = {"z2": 0.0002, "z3": 0.01}[cond]
        expected = np.abs(np.array([v for _, v in losses(other)]) - base).max()
        assert parity[cond]["max_abs_diff"] == pytest.approx(expected, abs=1e-12)
        assert parity[cond]["verdict"] == verdict
        assert parity[cond]["speedup"] == pytest.approx(expect_mean["z1"] / expect_mean[cond], rel=1e-12)
    assert "| z2 | z1 | 12 |" in md and "**PASS**" in md and "**FAIL**" in md

    # failed and OOM runs are listed, with their reasons, never dropped
    assert "z0-mb64-r0" in md and "OOM" in md
    assert "z3-broken-r0" in md and "exit code 1" in md

    # outlier: z2 repeat 1, step 7 at 10x
    z2r1 = next(rid for rid, (c, r, _) in inputs["runs"].items() if c == "z2" and r == 1)
    run_json = next(r for r in data["runs"] if r["run_id"] == z2r1)
    assert run_json["stats"]["outlier_steps"] == [7]
    assert "Outlier rule" in md

    # data.json carries the complete histories
    for r in data["runs"]:
        if r["run_id"] in inputs["runs"]:
            hist = inputs["runs"][r["run_id"]][2]
            assert r["history"]["iter_time"]["step"] == STEPS
            assert r["history"]["iter_time"]["value"] == [v for _, v in hist["iter_time"]]
            assert r["history"]["loss"]["value"] == pytest.approx([v for _, v in hist["loss"]], abs=0)

    # charts exist and are referenced
    for png in ("loss.png", "iter_time.png", "memory.png", "throughput.png", "tradeoff.png"):
        assert (out / png).stat().st_size > 5000
        assert f"({png})" in md
    # setup, commands, ds config
    assert "0.19.8" in md and "deepspeed runners/train.py --condition z3" in md
    assert '"stage": 1' in md
    # the folder is an artifact of the batch's parent run
    names = {a.path for a in client.list_artifacts(inputs["parent"], "report")}
    assert "report/report.md" in names and "report/data.json" in names


def test_history_paths_agree(store: tuple[Any, str, str]) -> None:
    """The SQLite fast path, the generic SQL path and the public API read the same values."""
    from mlflow.entities import Metric

    client, exp_id, uri = store
    build_comparison(store)
    # a NaN loss, a negative step and a value re-logged at a step later (the newest wins)
    parent = client.search_runs([exp_id], "tags.`dstui.role` = 'batch'")[0].info.run_id
    rid = log_run(client, exp_id, parent, condition="odd", history={"loss": [(-1, 5.0), (1, 4.0), (2, float("nan"))]})
    client.log_batch(rid, metrics=[Metric("loss", 3.5, int(time.time() * 1000) + 10_000, 1)])
    loaded = {}
    for method in ("sqlite", "sql", "api"):
        _, runs = fetch_runs(client, EXP, batch=BATCH)
        if method == "sqlite":
            assert fetch_histories(client, uri, runs) == "sqlite"
        elif method == "sql":
            fetch._histories_sql(uri, runs)
        else:
            fetch._histories_api(client, runs, progress=None)
        loaded[method] = {r.run_id: r.history for r in runs}
    odd = loaded["sqlite"][rid]["loss"]
    assert odd[0].tolist() == [-1, 1, 2]
    np.testing.assert_array_equal(odd[1], [5.0, 3.5, np.nan])
    for other in ("sql", "api"):
        assert loaded[other].keys() == loaded["sqlite"].keys()
        for run_id, hist in loaded["sqlite"].items():
            assert hist.keys() == loaded[other][run_id].keys()
            for k in hist:
                np.testing.assert_array_equal(hist[k][0], loaded[other][run_id][k][0])
                np.testing.assert_array_equal(hist[k][1], loaded[other][run_id][k][1])


@HEAVY
def test_grid_with_oom_and_failed_cells(store: tuple[Any, str, str], tmp_path: Path) -> None:
    client, exp_id, _ = store
    parent = make_parent(client, exp_id, BATCH)
    expect = {}
    for stage, offload in ((2, "none"), (3, "cpu")):
        for model, scale in (("t5-small", 1.0), ("t5-large", 3.0)):
            for mb in (1, 2, 4):
                cond = f"z{stage}-{offload}-{model}-mb{mb}"
                params = {"zero_stage": stage, "offload": offload, "model": model, "micro_batch": mb}
                if model == "t5-large" and mb == 4 and offload == "none":
                    log_run(client, exp_id, parent, condition=cond, status="failed",
                            reason="CUDA out of memory. Tried to allocate 2.00 GiB", params=params)
                    expect[(stage, model, mb)] = "OOM"
                    continue
                if model == "t5-small" and mb == 2 and offload == "cpu":
                    log_run(client, exp_id, parent, condition=cond, status="failed", reason="NCCL timeout", params=params)
                    expect[(stage, model, mb)] = "FAIL"
                    continue
                t = 0.1 * scale * mb
                log_run(client, exp_id, parent, condition=cond, params=params,
                        history={"iter_time": [(s, t) for s in STEPS], "mem_peak": [(s, scale * mb * GB) for s in STEPS]})
                expect[(stage, model, mb)] = (t, scale * mb)
    out = tmp_path / "grid"
    md = export_report(EXP, out).read_text()
    it_rows = read_csv(out / "grid_iter_time.csv")
    mem_rows = read_csv(out / "grid_mem.csv")
    assert len(it_rows) == 4 and len(mem_rows) == 4
    for it_row, mem_row in zip(it_rows, mem_rows, strict=True):
        stage = 2 if it_row["level"] == "ZeRO-2" else 3
        assert it_row["level"] in ("ZeRO-2", "ZeRO-3 + offload cpu")
        for mb in (1, 2, 4):
            want = expect[(stage, it_row["model"], mb)]
            if isinstance(want, str):
                assert it_row[str(mb)] == want and mem_row[str(mb)] == want
            else:
                assert float(it_row[str(mb)]) == pytest.approx(want[0])
                assert float(mem_row[str(mb)]) == pytest.approx(want[1])
    assert "## Grids by model and micro batch" in md
    assert "| t5-large | 0.3 | 0.6 | OOM |" in md


def test_verify_runs_and_revisions(store: tuple[Any, str, str], tmp_path: Path) -> None:
    client, exp_id, _ = store
    parent = make_parent(client, exp_id, BATCH)
    for rev in ("v1", "v2"):
        log_run(client, exp_id, parent, condition="z1", revision=rev,
                history={"iter_time": [(s, 0.5 if rev == "v1" else 0.25) for s in STEPS], "loss": losses(0.0)})
    log_run(client, exp_id, parent, condition="verify-z3", kind="verify", tags={"dstui.verdict": "FAIL"},
            metrics={"grad_max_abs_diff": 0.125, "loss_max_abs_diff": 0.0})
    md = export_report(EXP, tmp_path / "v", baseline="z1 @ v1").read_text()
    assert "z1 @ v1" in md and "z1 @ v2" in md
    assert "## Verification runs" in md and "**FAIL**" in md and "1.250e-01" in md
    data = json.loads((tmp_path / "v" / "data.json").read_text())
    parity = data["parity"][0]
    assert parity["label"] == "z1 @ v2" and parity["speedup"] == pytest.approx(2.0) and parity["verdict"] == "PASS"


def test_unknown_experiment_is_a_clear_error(store: tuple[Any, str, str], tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="no MLflow experiment named 'nope'"):
        export_report("nope", tmp_path / "x")
    with pytest.raises(ReportError, match="no dstui runs"):
        export_report(EXP, tmp_path / "x")
