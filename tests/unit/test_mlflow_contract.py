"""The MLflow contract of a run (docs/ARCHITECTURE.md, "MLflow layout"): params, system-metric names, links.

Params are what MLflow's compare view offers as axes: only settings that describe the
computation, none empty, the DeepSpeed version among them, and a ``kind: command``
run only what applies to it. System metrics carry the names of MLflow's own logger.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import psutil
import pytest

from dstui.execute import mlflow_params, sysmetrics
from dstui.execute.mlflow_runs import batch_note, batch_params, run_note
from dstui.spec import dsconfig
from dstui.spec.experiment import RunSpec
from dstui.spec.settings import Settings
from dstui.tracking import client as tracking


def resolved(**settings) -> tuple[dict, dict]:
    """A condition's settings as spec.json holds them, and its generated ds_config."""
    run = RunSpec(experiment="e", condition="c", settings=Settings(**settings))
    return run.settings.model_dump(mode="json"), dsconfig.build(run)


def test_train_params_are_the_settings_that_matter_and_none_is_empty() -> None:
    settings, ds = resolved(zero_stage=2, micro_batch=4, env={"OMP_NUM_THREADS": "2", "API_TOKEN": "s3cret"})
    p = mlflow_params.settings_params(settings, ds)
    assert all(v != "" for v in p.values()), {k for k, v in p.items() if v == ""}
    assert p["zero_stage"] == "2" and p["micro_batch"] == "4" and p["model"] == "tiny-llama"
    assert p["lr"] == "0.0001" and p["seq_length"] == "128" and p["gpus"] == "1"
    # optimizer and schedule, as the runner ends up with them (DeepSpeed's AdamW unless torch_adam)
    assert p["optimizer"] == "deepspeed AdamW" and p["optimizer.weight_decay"] == "0.0"
    assert p["scheduler"] == "constant"
    # a setting is one param: its ds_config twin (the duplicate stage) is not another
    assert "ds.zero_optimization.stage" not in p and "ds.train_micro_batch_size_per_gpu" not in p
    assert "ds.optimizer.params.lr" not in p and "ds.steps_per_print" not in p
    assert p["ds.gradient_clipping"] == "1.0"  # what the settings do not say stays
    # identity and bookkeeping are tags, empty or inert settings are nothing
    for absent in ("run_key", "repeat", "command", "extra_args", "launcher.hostfile", "launcher.extra_args",
                   "dataset_config", "hung_after_s", "env_visible", "nvme_path", "sp_mode", "kind"):  # fmt: skip
        assert absent not in p, absent
    assert p["env.OMP_NUM_THREADS"] == "2" and p["env.API_TOKEN"] == "***"  # masked unless allow-listed


def test_torch_adam_and_a_scheduler_show_as_such() -> None:
    settings, ds = resolved(torch_adam=True, ds_overrides={"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5}}})
    p = mlflow_params.settings_params(settings, ds)
    assert p["optimizer"] == "torch.optim.AdamW"
    assert p["scheduler"] == "WarmupLR" and p["ds.scheduler.params.warmup_num_steps"] == "5"


def test_command_runs_log_only_what_applies_to_them() -> None:
    settings, ds = resolved(kind="command", command=["{python}", "-c", "print(1)"], gpus=2, steps=5, warmup_steps=1)
    p = mlflow_params.settings_params(settings, ds)
    assert p == {"command": json.dumps(["{python}", "-c", "print(1)"]), "gpus": "2", "nodes": "1", "steps": "5",
                 "warmup_steps": "1"}  # fmt: skip


def test_verify_runs_log_their_tolerances_not_train_only_settings() -> None:
    settings, ds = resolved(kind="verify", rtol=1e-5)
    p = mlflow_params.settings_params(settings, ds)
    assert p["rtol"] == "1e-05" and "dataset" not in p and "warmup_steps" not in p


@pytest.mark.parametrize(
    ("revision", "sha", "source"),
    [
        ({"kind": "pypi", "requested": "0.18.0"}, None, "pypi"),
        ({"kind": "git", "requested": "master", "sha": "abc123"}, "abc123", "git:abc123"),
        ({"kind": "path", "requested": "/src/DeepSpeed", "diff_path": "/x/source.diff"}, None, "path:/src/DeepSpeed+diff"),
        ({}, None, "installed"),
        ({}, "def456", "installed git:def456"),
    ],
)
def test_deepspeed_version_and_source_are_params(revision: dict, sha: str | None, source: str) -> None:
    header = {"versions": {"deepspeed": "0.18.2", "torch": "2.13.0"}, "deepspeed_git_sha": sha, "params": 1234567,
              "tokens_per_step": 256, "world_size": 2, "peak_tflops": None,
              "model_shape": {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 4, "vocab": 256}}  # fmt: skip
    p = mlflow_params.header_params(header, revision)
    assert p["deepspeed.version"] == "0.18.2" and p["deepspeed.source"] == source
    assert p["model.parameters"] == "1234567" and p["model.layers"] == "2" and p["model.hidden"] == "64"
    assert p["model.heads"] == "4" and p["tokens_per_step"] == "256"
    assert "peak_tflops" not in p and "params" not in p  # nothing empty; the count under a clear name


def test_a_header_without_versions_gives_no_deepspeed_params() -> None:
    assert mlflow_params.header_params({"type": "header"}) == {}


def mlflow_logger_names() -> set[str]:
    """The metric names MLflow's own system-metrics logger writes (its source, installed)."""
    import mlflow.system_metrics.metrics as pkg

    names: set[str] = set()
    for f in Path(pkg.__file__).parent.glob("*_monitor.py"):
        for m in re.finditer(r'_metrics\[f?"([a-z_{}]+)"\]', f.read_text()):
            names.add(m.group(1).replace("{i}", "0"))
    return names


def test_system_metric_names_are_mlflows_own() -> None:
    names = mlflow_logger_names()
    assert "cpu_utilization_percentage" in names and "gpu_0_power_usage_watts" in names  # the source was read
    rec = {"time": 1000.0, "node": "box1", "cpu_percent": 50.0, "mem_used_bytes": 2e9, "mem_used_percent": 25.0,
           "gpu0_util_percent": 90.0, "gpu0_mem_used_bytes": 3e9, "gpu0_power_w": 250.0, "gpu1_util_percent": 80.0,
           "job_cpu_percent": 180.0, "job_rss_bytes": 1.5e9, "job_processes": 3.0}  # fmt: skip
    points = sysmetrics.mlflow_points(rec, started=990.0, multi_node=False)
    keys = {k: v for k, v, _, _ in points}
    host = {re.sub(r"gpu_\d+_", "gpu_0_", k.removeprefix("system/")) for k in keys if not k.startswith("system/job_")}
    assert len(host) == 6 and host <= names, host - names
    assert keys["system/gpu_0_memory_usage_megabytes"] == 3000.0 and keys["system/system_memory_usage_megabytes"] == 2000.0
    assert keys["system/gpu_1_utilization_percentage"] == 80.0
    assert keys["system/job_memory_usage_megabytes"] == 1500.0
    assert {step for _, _, _, step in points} == {10}  # seconds since launch
    assert {ts for _, _, ts, _ in points} == {1_000_000}


def test_node_prefix_only_when_a_run_spans_nodes() -> None:
    rec = {"time": 5.0, "node": "box1", "cpu_percent": 1.0}
    assert [p[0] for p in sysmetrics.mlflow_points(rec, started=1.0, multi_node=True)] == [
        "system/box1/cpu_utilization_percentage"
    ]
    assert [p[0] for p in sysmetrics.mlflow_points(rec, started=1.0, multi_node=False)] == [
        "system/cpu_utilization_percentage"
    ]


def test_bad_readings_give_no_points() -> None:
    rec = {"time": 15.0, "node": "n", "job_rss_bytes": 1e9, "cpu_percent": float("nan"), "job_processes": True, "x": 1.0}
    assert [(k, v, s) for k, v, _, s in sysmetrics.mlflow_points(rec, started=10.0, multi_node=False)] == [
        ("system/job_memory_usage_megabytes", 1000.0, 5)
    ]
    assert sysmetrics.mlflow_points({"time": "x", "cpu_percent": 1.0}, started=None, multi_node=False) == []


def test_only_samples_taken_while_the_job_lived() -> None:
    """A job that exited (a zombie not yet reaped, then gone) gives no reading: no last job_rss_bytes = 0."""
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    tree = sysmetrics.ProcessTreeSampler(proc.pid)
    try:
        assert tree.sample()["job_rss_bytes"] > 0 and sysmetrics.sample(tree, [])["job_processes"] == 1
    finally:
        proc.kill()
    while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.05)
    assert tree.sample() == {} and sysmetrics.sample(tree, []) is None  # exited, not reaped yet
    proc.wait()
    assert tree.sample() == {} and sysmetrics.sample(tree, []) is None
    assert sysmetrics.sample(None, [])["cpu_percent"] >= 0  # a host reading without a job still is one


def test_no_reading_once_the_ranks_are_gone_and_no_cpu_before_an_interval() -> None:
    """A launcher left alone after its ranks exited gave the run's last reading: 19 MB, 1 process, 0.5% CPU."""
    import subprocess
    import sys
    import time

    launcher = ("import subprocess, sys, time; "
                "subprocess.run([sys.executable, '-c', 'import time; time.sleep(1.5)']); time.sleep(30)")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", launcher])  # a launcher and one rank
    tree = sysmetrics.ProcessTreeSampler(proc.pid, wrapper=True)
    rank_tree = sysmetrics.ProcessTreeSampler(proc.pid)  # the same tree followed as a rank's
    try:
        deadline = time.time() + 10
        while len(psutil.Process(proc.pid).children()) == 0 and time.time() < deadline:
            time.sleep(0.02)
        assert rank_tree.sample()["job_processes"] == 2
        first = tree.sample()
        assert first["job_processes"] == 2 and "job_cpu_percent" not in first  # no interval yet: no CPU figure
        second = tree.sample()
        assert second["job_processes"] == 2 and second["job_cpu_percent"] >= 0
        while psutil.Process(proc.pid).children() and time.time() < deadline:
            time.sleep(0.05)
        assert psutil.Process(proc.pid).is_running()  # the launcher lives on ...
        assert tree.sample() == {} and sysmetrics.sample(tree, []) is None  # ... but the job is over
        assert rank_tree.sample()["job_processes"] == 1  # a rank that lost a helper child goes on
    finally:
        proc.kill()
        proc.wait()


def test_parent_run_carries_the_batch() -> None:
    info = {"id": "b-1", "spec_path": "/x/s.yaml", "runs": ["z0-r0", "z1-r0"],
            "spec": {"description": "ZeRO 0 vs 1", "axes": {"zero_stage": [0, 1]}, "baseline": "z0", "repeats": 1,
                     "conditions": [], "revisions": []}}  # fmt: skip
    note = batch_note(info)
    assert note.startswith("ZeRO 0 vs 1") and "`zero_stage`: 0, 1" in note and "baseline: `z0`" in note
    assert batch_params(info["spec"]) == {"axis.zero_stage": "[0, 1]", "baseline": "z0", "repeats": "1"}
    link = run_note("z1-r0", {"condition": "z1", "revision": "installed", "repeat": 0}, "b-1", "7", "pid9")
    assert "[b-1](#/experiments/7/runs/pid9?workflowType=machine_learning)" in link  # its training layout


def test_report_preview_embeds_its_images_and_no_live_html(tmp_path: Path) -> None:
    from dstui.tracking.report_preview import report_html

    (tmp_path / "loss.png").write_bytes(b"\x89PNG fake")
    (tmp_path.parent / "outside.png").write_bytes(b"\x89PNG secret")
    md = ("# R <script>alert(1)</script>\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n![loss](loss.png) ![up](../outside.png) "
          "![abs](https://x/y.png)\n\n[bad](javascript:alert(1)) [ok](https://example.org)\n")  # fmt: skip
    page = report_html(md, tmp_path)
    assert '<img src="data:image/png;base64,iVBORyBmYWtl" alt="loss"' in page  # the chart is inside the page
    assert 'src="../outside.png"' in page and "PNG secret" not in page  # nothing from outside the folder
    assert 'src="https://x/y.png"' in page and "<table>" in page
    assert "<script>" not in page and "&lt;script&gt;" in page  # the report's text stays text
    assert 'href="javascript:' not in page and 'href="https://example.org"' in page


def test_compare_url_selects_the_batch_runs() -> None:
    url = tracking.compare_url("http://127.0.0.1:5000/", "3", ["a1", "b2"])
    assert url == ("http://127.0.0.1:5000/#/compare-runs?runs=%5B%22a1%22%2C%22b2%22%5D&experiments=%5B%223%22%5D"
                   "&workflowType=machine_learning")


def test_ingest_sends_summaries_at_step_0_and_system_readings_by_seconds_since_launch(tmp_path: Path) -> None:
    """What the supervisor sends for a run folder: summary.* once at step 0 (bars), system/* by time into the run."""
    from dstui.core.rundir import RunDir, write_json_atomic
    from dstui.execute.ingest import Tracked, read_points

    rd = RunDir(tmp_path / "r0")
    rd.path.mkdir()
    write_json_atomic(rd.spec_file, {"settings": {"kind": "train", "nodes": 1}})
    write_json_atomic(rd.status_file, {"state": "running", "started": 100.0})
    rd.metrics_file.write_text("\n".join(json.dumps(r) for r in (
        {"type": "step", "time": 103.0, "step": 1, "loss": 2.0, "grad_norm": 0.5},
        {"type": "step", "time": 104.0, "step": 2, "loss": 1.5, "grad_norm": 0.25},
        {"type": "summary", "time": 105.0, "steps": 2, "iter_time_mean": 0.3, "status": "ok"},
    )) + "\n")  # fmt: skip
    rd.system_file.write_text(json.dumps({"time": 102.6, "node": "n", "cpu_percent": 40.0, "job_rss_bytes": 2e9}) + "\n")
    points = read_points(Tracked.load(rd, "jsonl"), on_header=lambda rec: None)
    by_key = {(k, step): v for k, v, _, step in points}
    assert by_key[("grad_norm", 2)] == 0.25 and by_key[("loss", 1)] == 2.0
    assert by_key[("summary.iter_time_mean", 0)] == 0.3 and by_key[("summary.steps", 0)] == 2
    assert not [k for k, _, _, step in points if k.startswith("summary.") and step != 0]
    assert by_key[("system/cpu_utilization_percentage", 2)] == 40.0
    assert by_key[("system/job_memory_usage_megabytes", 2)] == 2000.0
