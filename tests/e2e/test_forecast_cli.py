"""The memory forecast in the CLI: `dstui list`'s column, `dstui run --dry-run`, skip_predicted_oom."""

from __future__ import annotations

import json

from helpers import dstui, mlflow_client

from dstui.analysis import forecast as fc
from dstui.spec.settings import Settings

OOM_SPEC = """
name: oom-demo
settings: {model: llama-1b, seq_length: 2048, micro_batch: 4, dtype: bf16, gpus: 2, steps: 3, warmup_steps: 1}
axes: {zero_stage: [0, 3]}
gpu_memory_gib: 30  # between ZeRO-0 (31.6 GiB) and ZeRO-3 (27.7 GiB) of llama-1b here
"""


def test_list_and_dry_run_show_the_forecast(home) -> None:
    spec = home / "oom.yaml"
    spec.write_text(OOM_SPEC)
    z0 = fc.forecast(Settings(model="llama-1b", seq_length=2048, micro_batch=4, dtype="bf16", gpus=2))
    z3 = fc.forecast(Settings(model="llama-1b", seq_length=2048, micro_batch=4, dtype="bf16", gpus=2, zero_stage=3))
    assert z0.gib > 30 > z3.gib
    out = dstui("list", str(spec), "--no-validate", check=True, env={"COLUMNS": "250"}).stdout  # no wrapped note
    assert "mem/GPU" in out and f"{z0.gib:.1f} GiB OOM" in out
    assert "memory forecast per GPU against 30.0 GiB" in out
    out = dstui("run", "--dry-run", "--no-validate", "--skip-predicted-oom", str(spec), check=True).stdout
    assert f"-> skipped: predicted OOM ({z0.gib:.1f} GiB > 30.0 GiB)" in out
    assert out.count("predicted OOM") == 1  # z3 fits


def test_skip_predicted_oom_launches_nothing_and_records_why(home) -> None:
    """Every run over the GPU is skipped: the supervisor ends them without starting DeepSpeed."""
    spec = home / "oom.yaml"
    spec.write_text(OOM_SPEC.replace("axes: {zero_stage: [0, 3]}", "skip_predicted_oom: true"))
    proc = dstui("run", "--no-validate", str(spec), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # skipped on purpose is not a failure
    z0 = fc.forecast(Settings(model="llama-1b", seq_length=2048, micro_batch=4, dtype="bf16", gpus=2))
    reason = f"skipped: predicted OOM ({z0.gib:.1f} GiB > 30.0 GiB)"
    assert f"base-r0: {reason}" in proc.stdout
    (batch,) = (home / "runs").iterdir()
    st = json.loads((batch / "base-r0" / "status.json").read_text())
    assert st["state"] == "skipped" and st["reason"] == reason and "pid" not in st
    assert not (batch / "base-r0" / "stdout.log").exists()
    client = mlflow_client()
    (run,) = client.search_runs([client.get_experiment_by_name("oom-demo").experiment_id], "tags.`dstui.role` = 'run'")
    assert run.data.tags["dstui.status"] == "skipped" and run.data.tags["dstui.reason"] == reason
