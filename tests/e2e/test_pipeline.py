"""The headless pipeline end to end: spec -> real runs -> run folders -> MLflow."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import SPECS, dstui, mlflow_client

from dstui.core.rundir import BatchDir, list_batches
from dstui.execute.launch import free_port


def children(client, experiment: str) -> list:
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment}"
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`dstui.role` = 'run'")
    return sorted(runs, key=lambda r: r.info.run_name)


def history(client, run, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))


@pytest.mark.e2e
@pytest.mark.xdist_group("smoke-batch")  # the worker that launches the shared batch reads it first
@pytest.mark.timeout(1800)  # the batch itself runs in the fixture, within this test's time
def test_smoke_spec_end_to_end(smoke_batch: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """2 gloo ranks, ZeRO 0-3, tracked live in MLflow, read back through MlflowClient.

    The batch is the session's ``smoke_batch`` (conftest): `dstui run configs/experiments/smoke.yaml`.
    """
    assert smoke_batch["returncode"] == 0, smoke_batch["stdout"] + smoke_batch["stderr"]
    home = Path(smoke_batch["home"])
    monkeypatch.setenv("DSTUI_HOME", str(home))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", smoke_batch["uri"])
    monkeypatch.delenv("DSTUI_RUNS_DIR", raising=False)
    (batch,) = list_batches(home / "runs")
    client = mlflow_client()
    runs = children(client, "smoke")
    assert [r.info.run_name for r in runs] == ["z0-r0", "z1-r0", "z2-r0", "z3-r0"]
    exp = client.get_experiment_by_name("smoke")
    (parent,) = client.search_runs([exp.experiment_id], filter_string="tags.`dstui.role` = 'batch'")
    assert parent.info.run_name == batch.id and parent.info.status == "FINISHED"

    first_losses = []
    for stage, run in enumerate(runs):
        assert run.info.status == "FINISHED"
        tags, params = run.data.tags, run.data.params
        assert tags["dstui.batch"] == batch.id and "mlflow.parentRunId" not in tags  # tied by tag, not nested
        assert tags["dstui.status"] == "done" and tags["dstui.condition"] == f"z{stage}"
        for tag in ("dstui.version.deepspeed", "dstui.version.torch", "dstui.version.transformers",
                    "dstui.version.python", "dstui.hostname", "dstui.device", "dstui.run_key"):  # fmt: skip
            assert tags.get(tag), f"{run.info.run_name}: tag {tag} missing"
        assert params["zero_stage"] == str(stage)
        assert "ds.zero_optimization.stage" not in params  # one param per setting (MLflow's compare view)
        assert params["gpus"] == "2" and params["model"] == "tiny-llama"
        for key in ("loss", "iter_time", "mem_peak_gib", "mem_alloc_gib", "tokens_per_s"):  # memory in GiB in MLflow
            h = history(client, run, key)
            assert [s for s, _ in h] == list(range(1, 9)), f"{key}: steps {h}"
            assert all(math.isfinite(v) for _, v in h)
        assert "summary.iter_time_mean" in run.data.metrics
        (dataset,) = run.inputs.dataset_inputs  # what it read, as MLflow's dataset input
        assert dataset.dataset.name == "tiny-corpus" and tags["dstui.dataset"] == "tiny-corpus"
        assert any(k.startswith("system/") for k in run.data.metrics)
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "run")}
        for name in ("stdout.log", "metrics.jsonl", "ds_config.json", "cmd.txt", "spec.json", "status.json"):
            assert f"run/{name}" in artifacts
        top = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"ds_config.json", "cmd.txt", "spec.json"} <= top  # where MLflow's compare page diffs them
        first_losses.append(history(client, run, "loss")[0][1])
    # same seed, fp32: every ZeRO stage computes the same first loss
    assert len(set(first_losses)) == 1, first_losses

    from dstui.core import shm

    for rd in batch.runs():
        assert rd.status()["state"] == "done"
        assert "Epoch 1, Step 8, Loss:" in rd.log_file.read_text()
        # DeepSpeed's CPU all-reduce buffers (66 MB a rank, in RAM) must not outlive the run
        assert shm.buffers_of_port(shm.master_port_of(rd.status()["argv"])) == []
        # ... and its op (a 91-s JIT build on a fresh machine) is left out: no step of training uses it
        assert '"cpu_shm_op": "skipped (no step uses it)"' in rd.metrics_file.read_text()

    st = dstui("status", "--no-takeover", check=True).stdout
    assert batch.id in st and st.count(" done ") >= 4


def _write_spec(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.no_store  # nothing may create it
@pytest.mark.parametrize(
    ("data", "expect"),
    [
        ({"name": "bad", "axes": {"zero_stage": [1, 5]}}, ["condition 'z5'", "field 'zero_stage'", "must be one of 0, 1, 2, 3 (got 5)"]),
        ({"name": "bad", "settings": {"zero_stagee": 1}}, ["field 'settings.zero_stagee'", "unknown setting", "did you mean 'zero_stage'?"]),
        ({"name": "bad", "conditions": [{"name": "c0", "micro_batch": 0}]}, ["condition 'c0'", "field 'micro_batch'"]),
        ({"name": "bad", "settings": {"ds_config": "missing.json"}}, ["'missing.json' not found", "field 'ds_config'"]),
        ("name: bad\naxes: {zero_stage: [1, 2\n", ["invalid YAML at line"]),
    ],
)
def test_bad_input_launches_nothing(home: Path, data, expect: list[str]) -> None:
    spec = home / "bad.yaml"
    if isinstance(data, str):
        spec.write_text(data)
    else:
        _write_spec(spec, data)
    proc = dstui("run", str(spec))
    assert proc.returncode == 2
    msg = proc.stderr
    assert str(spec) in msg and "Traceback" not in msg
    for fragment in expect:
        assert fragment in msg, msg
    assert not (home / "runs").exists() or not list((home / "runs").iterdir())
    assert not (home / "mlruns" / "mlflow.db").exists()


def test_missing_spec_file(home: Path) -> None:
    proc = dstui("run", str(home / "nope.yaml"))
    assert proc.returncode == 2 and "no such spec file" in proc.stderr


def test_list_and_dry_run_show_runs_and_exact_commands(home: Path) -> None:
    out = dstui("list", str(SPECS / "smoke.yaml"), check=True).stdout
    assert "4 runs (smoke)" in out and "z3-r0" in out
    out = dstui("run", "--dry-run", str(SPECS / "smoke.yaml"), check=True).stdout
    commands = [line for line in out.splitlines() if "dstui.execute.injob.ranks" in line]
    assert len(commands) == 4  # single node: dstui starts the ranks, not DeepSpeed's launcher
    assert all("--nproc 2" in c and "runners/train.py" in c for c in commands)
    assert "--zero-stage 3" in commands[3]
    assert not (home / "runs").exists()


SLOW_SEED_PROGRAM = (
    "import sys, time\n"
    "n = int(sys.argv[1])\n"
    "for s in range(1, n + 1):\n"
    "    print(f'Epoch 1, Step {s}, Loss: {10.0 / s:.6f} sync: True time: 0.05 alloc_mem: {s} peak_mem: {2 * s}', flush=True)\n"
    "    print('some other log line', flush=True)\n"
    "    time.sleep(0.8)\n"
)


def test_user_command_in_seed_format_is_followed_live(home: Path) -> None:
    steps = 12
    spec = _write_spec(
        home / "cmd.yaml",
        {
            "name": "live-cmd",
            "settings": {"kind": "command", "metrics_format": "seed", "steps": steps, "warmup_steps": 1},
            "conditions": [{"name": "slow", "command": ["{python}", "-c", SLOW_SEED_PROGRAM, str(steps)]}],
        },
    )
    client = mlflow_client()
    client.search_experiments()  # create the store now, so polling below is quick
    proc = subprocess.Popen([sys.executable, "-m", "dstui", "run", "--detach", str(spec)], stdout=subprocess.PIPE, text=True)
    assert proc.wait(timeout=120) == 0
    seen_live = None
    deadline = time.time() + 120
    batch = None
    while time.time() < deadline:
        batches = list_batches(home / "runs")
        batch = batches[0] if batches else None
        if batch and batch.runs():
            rd = batch.runs()[0]
            st = rd.status()
            if st.get("state") == "running" and st.get("mlflow_run_id"):
                n = len(client.get_metric_history(st["mlflow_run_id"], "loss"))
                if 0 < n < steps:
                    seen_live = n
            if batch.is_finished() and batch.info().get("finalized"):
                break
        time.sleep(0.3)
    assert seen_live, "no metric reached MLflow while the run was still going"
    (run,) = children(client, "live-cmd")
    assert history(client, run, "loss") == [(s, round(10.0 / s, 6)) for s in range(1, steps + 1)]
    assert run.info.status == "FINISHED"


@pytest.mark.no_store  # nothing may go to it
def test_team_mlflow_server(home: Path, tmp_path: Path) -> None:
    """A team points dstui at a shared `mlflow server`: a real one on 127.0.0.1."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{tmp_path}/server.db",
         "--artifacts-destination", str(tmp_path / "server-artifacts"), "--workers", "1"],  # fmt: skip
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        import urllib.request

        deadline = time.time() + 90
        while True:
            try:
                urllib.request.urlopen(f"{uri}/health", timeout=2)
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise AssertionError("mlflow server did not come up") from None
                time.sleep(0.5)
        proc = dstui("run", str(SPECS / "seed_format_command.yaml"), env={"MLFLOW_TRACKING_URI": uri}, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        client = mlflow_client(uri)
        (run,) = children(client, "seed-command")
        assert [v for _, v in history(client, run, "loss")] == [5.0, 2.5, 1.666667, 1.25, 1.0]
        assert "run/stdout.log" in {a.path for a in client.list_artifacts(run.info.run_id, "run")}
        assert not (home / "mlruns" / "mlflow.db").exists()  # nothing went to the local store
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


def test_batch_json_records_the_plan(home: Path) -> None:
    proc = dstui("run", str(SPECS / "seed_format_command.yaml"), timeout=300)
    assert proc.returncode == 0, proc.stderr
    (batch,) = list_batches(home / "runs")
    info = json.loads(BatchDir(batch.path).batch_file.read_text())
    assert info["experiment"] == "seed-command" and info["runs"] == ["echo-steps-r0"]
    assert info["finalized"] is True
