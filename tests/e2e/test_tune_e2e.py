"""`dstui tune` end to end on the CPU: real DeepSpeed probes (2 gloo ranks), a real supervisor, a real MLflow store.

Issue 42's CPU proofs:

* over ZeRO 0-3 x micro batch 1/2/4 (global batch 8, tiny-llama), the search finds the winner of the
  exhaustive `dstui run` of the same grid, or one within that grid's measured noise, with fewer
  probes than the grid has runs, and no probe outside its time box;
* a probe that hangs (``DSTUI_INJECT_HANG``, honoured by runners/probe_control.py) is stopped at its
  box and the search goes on; `dstui tune` killed (SIGKILL) while that probe runs, then started again,
  follows the same probe to its end instead of launching it twice, and finishes the search.

CPU step times on a shared 2-core machine are noisy: the winner check compares 95% intervals of
the grid's own measurements (robust to stalls: runners' steps over 3x the median left out), never
exact equality. The grid runs in a home of its own, so the search cannot learn from it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from dstui.core.record_file import read_records
from dstui.core.rundir import BatchDir, RunDir
from dstui.execute.process_group import group_alive
from dstui.tune import probe_rules
from dstui.tune.probes import BOX_GRACE_S

pytestmark = pytest.mark.e2e

BOX_S = 150.0  # start-up of 2 CPU ranks under a loaded suite is 25-50 s; ZeRO-3's steps take seconds
SETTINGS = {"model": "tiny-llama", "dataset": "tiny-corpus", "seq_length": 64, "dtype": "fp32", "gpus": 2, "seed": 42,
            "torch_adam": True, "steps": 30, "warmup_steps": 3, "max_runtime_s": 150, "hung_after_s": 150}  # fmt: skip


def tune_spec(folder: Path, name: str, space: dict[str, Any], **tune: Any) -> Path:
    data = {"name": name, "settings": SETTINGS, "tune": {
        "global_batch": 8, "probe_time_box_s": BOX_S, "budget_s": 2400, "probe_steps": 40, "warmup_steps": 3,
        "precision": 0.05, "space": {"offload": ["none"], "activation_checkpointing": [False],
                                     "sequence_parallel": [1], **space}, **tune}}  # fmt: skip
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def env_for(home: Path, **extra: str) -> dict[str, str]:
    (home / "mlruns").mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("DSTUI_RUNS_DIR",)}
    return {**env, "DSTUI_HOME": str(home), "MLFLOW_TRACKING_URI": f"sqlite:///{home}/mlruns/mlflow.db", **extra}


def cli(*args: str, env: dict[str, str], timeout: float = 3000) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dstui", *args], env=env, capture_output=True, text=True, timeout=timeout)


def grid_times(batch: BatchDir) -> dict[str, probe_rules.StepTime]:
    """Each grid run's step time after warm-up with its 95% interval (the same statistic a probe uses)."""
    out = {}
    for rd in batch.runs():
        times = [float(r["iter_time"]) for r in read_records(rd.metrics_file) if r.get("type") == "step"]
        st = probe_rules.step_time(times, int(SETTINGS["warmup_steps"]))
        if st is not None and st.steps >= 2:
            out[rd.status()["condition"]] = st
    return out


@pytest.mark.timeout(2700)  # 12 grid runs and up to 11 probes of 2 CPU ranks: start-up (20-45 s each under load) dominates
@pytest.mark.xdist_group("tune")  # the suite's longest single test: tests/conftest.py starts it first
def test_tune_finds_the_grids_winner_with_fewer_probes_each_within_its_box(tmp_path: Path) -> None:
    spec = tune_spec(tmp_path, "tune-grid", {"zero_stage": [0, 1, 2, 3], "micro_batch": [1, 2, 4]})
    tune_env, grid_env = env_for(tmp_path / "tune-home"), env_for(tmp_path / "grid-home")
    preview = cli("tune", str(spec), "--dry-run", "--json", env=tune_env)
    assert preview.returncode == 0, preview.stderr
    plan = json.loads(preview.stdout)
    assert len(plan["candidates"]) == 12 and not any(c["left_out"] for c in plan["candidates"])
    assert all(c["predicted_s"] > 0 for c in plan["candidates"])

    grid = cli("run", plan["grid_spec"], "--json", env=grid_env)  # the exhaustive batch, in a home of its own
    runs = json.loads(grid.stdout)["runs"]
    assert len(runs) == 12, grid.stderr
    measured = grid_times(BatchDir(Path(runs[0]["path"]).parent))
    assert len(measured) >= 10, measured  # a ZeRO-3 run may time out before two timed steps: it cannot be best
    best = min(measured, key=lambda c: measured[c].mean)

    proc = cli("tune", str(spec), "--json", env=tune_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    winner = doc["winner"]
    probes = doc["ranking"]
    assert len(probes) < len(runs), [p["candidate"] for p in probes]
    for p in probes:  # no probe outside its time box (the supervisor's kill, or the tuner's own past its grace)
        assert p["wall_s"] <= BOX_S + BOX_GRACE_S, p
    w, b = measured[winner], measured[best]
    # tune probed the grid's best and says, in its ranking, that it is within the noise of its winner:
    # what tune's own measurements support (a suite run measured z0-mb4 27.8 ± 3.3 ms and z1-mb4 27.2 ± 1.3
    # in their probes, 22.9 and 40.3 in the grid minutes earlier: under 4 workers on 2 cores a run's step
    # time moves 2-3x within minutes, most of all for the stage with more collective calls)
    tied = {p["candidate"] for p in probes if p["within_noise_of_winner"]}
    if winner != best and w.low > b.high and best not in tied:
        _referee(winner, best, w, b, plan["grid_spec"], grid_env, tmp_path, proc.stderr)
    assert doc["stop_reason"] and doc["cost"]["probes"] == len(probes)

    _check_tracking_and_outputs(doc, tune_env, tmp_path)


def _referee(winner: str, best: str, w: probe_rules.StepTime, b: probe_rules.StepTime, grid_spec: str,
             env: dict[str, str], tmp_path: Path, log: str) -> None:  # fmt: skip
    """Minutes apart, a loaded 2-core machine can run the same configuration 3x slower: intervals from one
    run each do not hold that noise. So when the grid's intervals of the winner and the grid's best do not
    overlap, both run again side by side (W, B, W, B) and the winner must not be slower than the best by more
    than that window's own noise: the repeat-to-repeat spread plus the runs' interval half-widths."""
    data = yaml.safe_load(Path(grid_spec).read_text())
    data.update(name="referee", repeats=2, conditions=[c for c in data["conditions"] if c["name"] in (winner, best)])
    spec = tmp_path / "referee.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    runs = json.loads(cli("run", str(spec), "--json", env=env).stdout)["runs"]
    again: dict[str, list[probe_rules.StepTime]] = {}
    for r in runs:
        times = [float(x["iter_time"]) for x in read_records(Path(r["path"]) / "metrics.jsonl") if x.get("type") == "step"]
        again.setdefault(r["condition"], []).append(probe_rules.step_time(times, int(SETTINGS["warmup_steps"])))
    mean = {c: sum(t.mean for t in ts) / len(ts) for c, ts in again.items()}
    noise = max(abs(ts[0].mean - ts[1].mean) + (ts[0].half + ts[1].half) / 2 for ts in again.values())
    assert mean[winner] - mean[best] <= noise, (
        f"tune chose {winner} ({w.mean * 1e3:.1f} ± {w.half * 1e3:.1f} ms in the grid), the grid's best is {best} "
        f"({b.mean * 1e3:.1f} ± {b.half * 1e3:.1f} ms); side by side: {winner} {mean[winner] * 1e3:.1f} ms, "
        f"{best} {mean[best] * 1e3:.1f} ms, noise {noise * 1e3:.1f} ms\n{log[-3000:]}"
    )


def _check_tracking_and_outputs(doc: dict[str, Any], env: dict[str, str], tmp_path: Path) -> None:
    """MLflow: the search is a batch run, one run per probe (of that batch) with its prediction; the files work."""
    from mlflow import MlflowClient

    c = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = c.get_experiment_by_name("tune-grid-tune")
    parents = c.search_runs([exp.experiment_id], "tags.`dstui.role` = 'batch'")
    assert len(parents) == 1 and parents[0].data.tags["dstui.tune.winner"] == doc["winner"]
    batch = parents[0].data.tags["dstui.batch"]  # runs are tied to their batch by this tag, not nested (tracking/layout.py)
    children = c.search_runs([exp.experiment_id], f"tags.`dstui.batch` = '{batch}' and tags.`dstui.role` = 'run'")
    assert len(children) == doc["cost"]["probes"]
    assert all("tune.predicted_iter_time" in ch.data.metrics for ch in children)
    report = cli("report", "--experiment", "tune-grid-tune", "-o", str(tmp_path / "report"), env=env, timeout=600)
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## Tuning" in text and f"Winner: **{doc['winner']}**" in text and "](tuning.png)" in text
    assert "## Step time: predicted vs measured" in text
    assert (tmp_path / "report" / "tuning.png").stat().st_size > 10_000
    listed = cli("list", doc["winner_spec"], "--json", env=env, timeout=600)  # the winner's spec is a valid spec
    assert listed.returncode == 0, listed.stderr
    assert [r["condition"] for r in json.loads(listed.stdout)["runs"]] == ["base"]


def _state(folder: Path) -> dict[str, Any]:
    try:
        return json.loads((folder / "state.json").read_text())
    except (OSError, ValueError):
        return {}


@pytest.mark.timeout(1200)
def test_a_hung_probe_is_stopped_at_its_box_and_a_killed_search_resumes(tmp_path: Path) -> None:
    spec = tune_spec(tmp_path, "tune-hang", {"zero_stage": [1], "micro_batch": [2, 4]}, probe_time_box_s=90.0)
    env = env_for(tmp_path / "home", DSTUI_INJECT_HANG="zero_stage=1,micro_batch=4,step=4")
    plan = json.loads(cli("tune", str(spec), "--dry-run", "--json", env=env).stdout)
    folder = Path(plan["folder"])
    first = min(plan["candidates"], key=lambda c: c["predicted_s"])["candidate"]
    assert first == "z1-mb4-ga1"  # the one that hangs is probed first: the prior ranks the larger micro batch faster

    tuner = subprocess.Popen([sys.executable, "-m", "dstui", "tune", str(spec)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    deadline = time.time() + 400
    run_dir = None
    while time.time() < deadline:  # wait until the probe hangs: its third step logged, its run still running
        st = _state(folder)
        if st.get("in_flight") == first and st.get("batch"):
            run_dir = RunDir(Path(env["DSTUI_HOME"]) / "runs" / st["batch"] / f"{first}-r0")
            if run_dir.status().get("steps_done", 0) >= 4:
                break
        time.sleep(0.5)
    assert run_dir is not None and run_dir.status().get("state") == "running", tuner.stdout
    os.kill(tuner.pid, signal.SIGKILL)  # the tuner only: the probe and its supervisor live in their own sessions
    tuner.wait(timeout=30)

    again = cli("tune", str(spec), "--json", env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"following probe {first}" in again.stderr and "(started before a restart)" in again.stderr
    doc = json.loads(again.stdout)
    hung = next(p for p in doc["ranking"] if p["candidate"] == first)
    assert hung["outcome"].startswith("time box (90 s)") and hung["measured_s"] is None, hung
    assert hung["wall_s"] <= 90.0 + BOX_GRACE_S, hung
    assert doc["winner"] == "z1-mb2-ga2" and len(doc["ranking"]) == 2  # the search went on; no probe ran twice
    batch = BatchDir(run_dir.path.parent)
    assert sorted(rd.name for rd in batch.runs()) == ["z1-mb2-ga2-r0", "z1-mb4-ga1-r0"]
    assert not group_alive(run_dir.status().get("pgid"))  # the hung ranks are gone


@pytest.mark.timeout(900)
def test_a_stop_request_ends_a_run_as_finished_after_that_step(tmp_path: Path) -> None:
    """What a probe relies on: the runner reads stop.request between steps and ends as a run that finished."""
    spec = tmp_path / "long.yaml"
    spec.write_text(yaml.safe_dump({"name": "long", "settings": {**SETTINGS, "steps": 400, "max_runtime_s": 600},
                                    "conditions": [{"name": "z1", "zero_stage": 1, "micro_batch": 2}]}))  # fmt: skip
    env = env_for(tmp_path / "home")
    started = cli("run", str(spec), "--detach", "--json", env=env)
    rd = RunDir(Path(json.loads(started.stdout)["runs"][0]["path"]))
    deadline = time.time() + 400
    while time.time() < deadline and rd.status().get("steps_done", 0) < 5:
        time.sleep(0.3)
    assert rd.status().get("state") == "running", rd.log_tail()
    rd.stop_file.write_text("ranked")
    while time.time() < deadline and rd.status().get("state") not in ("done", "failed", "killed"):
        time.sleep(0.3)
    st = rd.status()
    summary = next(r for r in read_records(rd.metrics_file) if r.get("type") == "summary")
    assert st["state"] == "done" and st.get("reason") is None, st
    assert summary["stopped_at"] == summary["steps"] == st["steps_done"] < 400
    assert summary["iter_time_mean"] > 0 and summary["status"] == "ok"
