"""`dstui import`: seed-format logs into a real MLflow SQLite store, read back exactly."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from dstui.importer.lines import parse_kv_line, parse_summary_line
from dstui.importer.names import params_from_name
from dstui.importer.seedlogs import ImportError_, import_dir

GIB = 1024**3

NOISE = [
    "[2025-06-17 03:51:20,299] [INFO] [real_accelerator.py:254:get_accelerator] Setting ds_accelerator to cuda",
    "Loading model and tokenizer...",
    "Map:  10%|█         | 37000/360270 [00:07<01:14, 4363.76 examples/s]",
    "wandb: Run summary:",
    "wandb:      summary/average_iteration_time 0.47825",
    "",
]
GARBAGE = [
    "Epoch 1, Step 7, Loss: nana sync: True time: 0.4 alloc_mem: 1 peak_mem: 2",  # not a float
    "Epoch 1, Step",  # truncated
    "Loss: ??? (corrupted)",
    "step=x loss=1.0 time=0.3",  # key=value with a bad step
    "iteration time: broken",
]


def make_steps(n: int, seed: int, *, interval: int = 1) -> list[tuple[int, float, float, int, int]]:
    rng = random.Random(seed)
    out = []
    for i in range(1, n + 1):
        # full-precision floats as loss.item()/time.time() differences print them
        out.append((i * interval, rng.uniform(0.5, 11.0), rng.uniform(0.05, 5.0), rng.randrange(1 << 34), rng.randrange(1 << 36)))
    return out


def write_log(path: Path, steps: list[tuple[int, float, float, int, int]], *, summary: str | None, garbage: bool = True, tail: list[str] = (), zero: int = 1) -> None:
    lines = ["NUM_NODES: 1 NGPUS_PER_NODE: 8 NUM_PROCESSES: 8", "NUM_NODES: 1", *NOISE,
             "Namespace(model_name='meta-llama/Meta-Llama-3-8B', batch_size=1, seq_length=512, "
             f"gradient_accumulation_steps=4, zero_stage={zero}, compile=False, warmup_step=15, log_interval=10)"]
    for i, (s, loss, t, a, p) in enumerate(steps):
        lines.append(f"Epoch 1, Step {s}, Loss: {loss!r} sync: True time: {t!r} alloc_mem: {a} peak_mem: {p}")
        if garbage and i % 10 == 3:
            lines.append(GARBAGE[(i // 10) % len(GARBAGE)])
        if i % 7 == 0:
            lines.append(NOISE[i % len(NOISE)])
    if summary:
        lines.append(summary)
    lines += list(tail)
    path.write_text("\n".join(lines) + "\n")


SUMMARY = (
    "meta-llama/Meta-Llama-3-8B ds=True np=8 batch_size=1 seq=512 zero_stage={z} acc=4 ac=False "
    "compile={dc} backend=inductor deepcompile={dc} passes=None compile_time=12.5 "
    "iteration time: 0.4782 alloc_mem: 28307113472 peak_mem: 50064946688"
)


def build_folder(root: Path) -> dict[str, Any]:
    root.mkdir(parents=True)
    steps = {
        "z1_baseline": make_steps(60, 1, interval=4),
        "z3_deepcompile": make_steps(45, 2),
        "z2_oom": make_steps(5, 3),
    }
    write_log(root / "z1_baseline.log", steps["z1_baseline"], summary=SUMMARY.format(z=1, dc=False))
    # run_batch_enhanced.sh copies the same output to *_detailed.log: imported once
    write_log(root / "z1_baseline_detailed.log", steps["z1_baseline"], summary=SUMMARY.format(z=1, dc=False))
    write_log(root / "z3_deepcompile.log", steps["z3_deepcompile"], summary=SUMMARY.format(z=3, dc=True), zero=3)
    write_log(
        root / "z2_oom.log", steps["z2_oom"], summary=None, garbage=False, zero=2,
        tail=["Traceback (most recent call last):", '  File "x.py", line 1',
              "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"],
    )
    (root / "experiment_log.txt").write_text("=== Starting batch experiments ===\nRunning condition: z1_baseline\n")
    meta = {
        "experiment_date": "2025-06-17T04:31:10+00:00",
        "conditions": {
            "z1_baseline": {"command": "--backend deepspeed --zero_stage 1 --gradient_accumulation_steps 4", "exit_code": 0, "wandb_run": "unknown"},
            "z3_deepcompile": {"command": "--backend deepspeed --zero_stage 3 --compile --deepcompile", "exit_code": 0, "wandb_run": "abc123"},
            "z2_oom": {"command": "--backend deepspeed --zero_stage 2", "exit_code": 1, "wandb_run": "unknown"},
        },
    }
    (root / "metadata.json").write_text(json.dumps(meta, indent=4))
    return steps


def history(client: Any, rid: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(rid, key)}


def test_import_reproduces_every_step_exactly(uri: str, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    root = tmp_path / "results_20250617_035117"
    steps = build_folder(root)
    result = import_dir(root, "old")
    assert result.batch == "import-results_20250617_035117"
    assert {r.condition for r in result.runs} == {"z1_baseline", "z3_deepcompile", "z2_oom"}
    assert ("z1_baseline_detailed.log", "same steps as z1_baseline.log") in result.skipped
    assert any(p == "experiment_log.txt" for p, _ in result.skipped)
    # garbage: every 10th step line (from index 3) of the two garbage-carrying, imported logs,
    # plus the same again in the skipped duplicate (counted, since it was read)
    expected_bad = 2 * len(range(3, 60, 10)) + len(range(3, 45, 10))
    assert result.malformed_lines == expected_bad
    assert "malformed line(s)" in result.summary_text()

    client = MlflowClient(uri)
    runs = {r.condition: r for r in result.runs}
    for cond, pts in steps.items():
        rid = runs[cond].run_id
        assert runs[cond].steps == len(pts)
        assert history(client, rid, "loss") == {s: loss for s, loss, _, _, _ in pts}
        assert history(client, rid, "iter_time") == {s: t for s, _, t, _, _ in pts}
        # memory in GiB under a unit name, as the supervisor logs it (dstui.tracking.metric_names)
        assert history(client, rid, "mem_alloc_gib") == pytest.approx({s: a / 2**30 for s, _, _, a, _ in pts})
        assert history(client, rid, "mem_peak_gib") == pytest.approx({s: p / 2**30 for s, _, _, _, p in pts})
        run = client.get_run(rid)
        tags, params = run.data.tags, run.data.params
        assert tags["dstui.role"] == "run" and tags["dstui.batch"] == result.batch
        assert "mlflow.parentRunId" not in tags  # not nested: the batch run stays out of the runs' charts
        assert tags["dstui.condition"] == cond and tags["dstui.imported_from"] == str(root / f"{cond}.log")
        assert params["model"] == "meta-llama/Meta-Llama-3-8B"
        assert params["micro_batch"] == "1" and params["seq_length"] == "512" and params["grad_accum"] == "4"
    z1 = client.get_run(runs["z1_baseline"].run_id)
    assert z1.data.params["zero_stage"] == "1" and z1.data.params["deepcompile"] == "false"
    assert z1.data.params["world_size"] == "8" and z1.data.params["gpus"] == "8"
    assert z1.data.params["warmup_steps"] == "4"  # first logged step (step 4) is warm-up
    assert z1.data.metrics["summary.iter_time_mean"] == 0.4782
    assert z1.data.metrics["summary.mem_peak_max_gib"] * 2**30 == pytest.approx(50064946688)
    assert z1.data.tags["dstui.status"] == "done" and z1.info.status == "FINISHED"
    z3 = client.get_run(runs["z3_deepcompile"].run_id)
    assert z3.data.params["zero_stage"] == "3" and z3.data.params["deepcompile"] == "true"
    assert z3.data.tags["dstui.wandb_run"] == "abc123"
    oom = client.get_run(runs["z2_oom"].run_id)
    assert oom.data.tags["dstui.status"] == "failed" and oom.info.status == "FAILED"
    # metadata says exit code 1; the log says why, and the why wins
    assert oom.data.tags["dstui.reason"] == "CUDA out of memory"
    assert oom.data.params["zero_stage"] == "2"
    parent = client.get_run(result.parent_run_id)
    assert parent.data.tags["dstui.role"] == "batch" and parent.data.tags["dstui.batch"] == result.batch

    # a second import of the same folder is refused; --force replaces it
    with pytest.raises(ImportError_, match="already imported"):
        import_dir(root, "old")
    again = import_dir(root, "old", force=True)
    assert again.batch == result.batch
    assert client.get_run(result.parent_run_id).info.lifecycle_stage == "deleted"


def test_oom_without_metadata_and_report_over_import(uri: str, tmp_path: Path) -> None:
    root = tmp_path / "logs2"
    root.mkdir()
    write_log(root / "z3_big.log", make_steps(3, 9), summary=None, garbage=False,
              tail=["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB"])
    write_log(root / "z1_small.log", make_steps(20, 8), summary=SUMMARY.format(z=1, dc=False), garbage=False)
    result = import_dir(root, "old")
    runs = {r.condition: r for r in result.runs}
    assert runs["z3_big"].status == "failed" and runs["z3_big"].reason == "CUDA out of memory"
    assert result.malformed_lines == 0

    from dstui.usecases.report import export_report

    md = export_report("old", tmp_path / "rep", batch=result.batch).read_text()
    assert "z3_big" in md and "OOM" in md and "z1_small" in md


def test_multi_run_file_is_split_at_summary_lines(uri: str, tmp_path: Path) -> None:
    f = tmp_path / "result.txt"
    lines = []
    for z in (1, 2, 3):
        lines += [f"Epoch 1, Step {s}, Loss: {1.0 / s + z} sync: True time: 0.{z} alloc_mem: 1 peak_mem: 2" for s in (1, 2, 3)]
        lines.append("20250101120000 " + SUMMARY.format(z=z, dc=False))
    f.write_text("\n".join(lines) + "\n")
    result = import_dir(f, "multi")
    assert [r.steps for r in result.runs] == [3, 3, 3]
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    stages = [client.get_run(r.run_id).data.params["zero_stage"] for r in result.runs]
    assert stages == ["1", "2", "3"]


def test_summary_line_variants() -> None:
    # DeepSpeedExamples benchmarks/deepcompile: deepcompile flag, GB memory
    p, s = parse_summary_line(
        "meta-llama/Llama-2-7b ds=True np=2 batch_size=1 seq=1024 zero_stage=3 acc=1 ac=True compile=True "
        "backend=inductor deepcompile=True passes=None compile_time=20.5 iteration time: 1.2345 "
        "alloc_mem: 1.50 GB peak_mem: 3.25 GB"
    )
    assert p == {"model": "meta-llama/Llama-2-7b", "deepspeed": True, "world_size": 2, "micro_batch": 1,
                 "seq_length": 1024, "zero_stage": 3, "grad_accum": 1, "activation_checkpointing": True,
                 "compile": True, "backend": "inductor", "deepcompile": True, "passes": None}
    assert s == {"compile_time": 20.5, "iter_time_mean": 1.2345, "mem_alloc": 1.5 * GIB, "mem_peak_max": 3.25 * GIB}
    # throughput variant
    _, s = parse_summary_line(
        "m ds=True np=8 batch_size=2 seq=512 zero_stage=1 acc=1 ac=False compile=False backend=inductor "
        "deepcompile=False passes=None compile_time=0 iteration time: 0.5000 samples/s: 32.0 tokens/s: 16384.0 "
        "alloc_mem: 10 peak_mem: 20 reserved_mem: 30 peak_reserved_mem: 40"
    )
    assert s["tokens_per_s_mean"] == 16384.0 and s["samples_per_s_mean"] == 32.0 and s["mem_reserved_max"] == 40
    assert parse_summary_line("nothing to see") is None
    # key=value forms
    kind, rec = parse_kv_line("step=10 epoch=1 loss=2.5 time=0.125 alloc_mem=100 peak_mem=200")
    assert kind == "step" and rec == {"type": "step", "step": 10, "epoch": 1, "loss": 2.5, "iter_time": 0.125, "mem_alloc": 100.0, "mem_peak": 200.0}
    kind, body = parse_kv_line("model=tiny world_size=2 micro_batch=4 seq_length=128 zero_stage=3 deepcompile=True iter_time_mean=0.5")
    assert kind == "summary" and body["params"]["deepcompile"] is True and body["summary"] == {"iter_time_mean": 0.5}
    assert params_from_name("debug_n0_Meta-Llama-3-8B_deepspeed_np2z3c0dc1E0b4seq512g1a1pALL") == {
        "world_size": 2, "zero_stage": 3, "deepcompile": True, "compile": False, "micro_batch": 4, "seq_length": 512,
    }


def test_import_cli(uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dstui.cli import main

    root = tmp_path / "r"
    root.mkdir()
    write_log(root / "a.log", make_steps(12, 5), summary=SUMMARY.format(z=2, dc=False))
    assert main(["import", str(root), "--experiment", "cli"]) == 0
    out = capsys.readouterr().out
    assert "imported 1 run(s), 12 steps" in out and "malformed line(s)" in out
    assert main(["report", "--experiment", "cli", "-o", str(tmp_path / "rep"), "-q"]) == 0
    assert (tmp_path / "rep" / "report.md").is_file()
    assert main(["import", str(tmp_path / "missing")]) == 2
