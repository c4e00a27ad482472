"""End-to-end tests of runners/train.py: real DeepSpeed launcher, 2 gloo ranks on CPU, no mocks.

All launches run in one module-scoped fixture, beside the smoke batch (below),
and the tests read their results: the launcher and rank start-up (imports)
dominates, and overlapping two jobs keeps the file fast on a 2-core machine.

The four ZeRO-stage runs are the session's smoke batch (conftest's ``smoke_batch``:
``dstui run configs/experiments/smoke.yaml``, the runner started the way dstui
starts it, with the ds_config dstui generates), which test_pipeline.py and
others read too: the records are checked here, in their run folders, rather
than from four more launches of the same runs.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from helpers import SPECS

from dstui.core.record_file import read_records
from dstui.core.records import parse_seed_line
from dstui.core.rundir import RunDir
from dstui.execute.launch import free_port
from dstui.spec.settings import Settings

# launches of two ranks: more than the default 600 s on a loaded 2-core machine
# one xdist worker runs the module: every test reads the launches of one module fixture
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800), pytest.mark.xdist_group("runner")]

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "runners" / "train.py"
STEPS = 4
STAGES = (0, 1, 2, 3)
SMOKE = yaml.safe_load((SPECS / "smoke.yaml").read_text())["settings"]  # the z0-z3 runs' settings
MAX_PARALLEL = 2
# started by DeepSpeed's launcher; the others (and the smoke batch) by dstui.execute.injob.ranks
DEEPSPEED_LAUNCHER = {"standalone", "t5"}
COMMON = [
    "--model",
    "tiny-llama",
    "--dataset",
    "tiny-corpus",
    "--seq-length",
    "64",
    "--steps",
    str(STEPS),
    "--warmup-steps",
    "1",
    "--seed",
    "7",
]


@dataclass
class Result:
    """One finished launch: exit code, all output, the rank-0 records."""

    rc: int
    out: str
    records: list[dict]
    wall: float

    def of(self, kind: str) -> list[dict]:
        return [r for r in self.records if r["type"] == kind]


def _start(
    args: list[str], metrics: Path | None, *, direct: bool = False
) -> tuple[subprocess.Popen, Path | None, float]:
    env = {k: v for k, v in os.environ.items() if k != "DSTUI_METRICS_FILE"}
    # One intra-op thread per rank: several launches share two cores, and
    # oversubscribed OpenMP threads spin rather than work.
    env["OMP_NUM_THREADS"] = "1"
    port = str(free_port())
    if direct:  # dstui's own rank starter (what dstui uses for single-node runs)
        launcher = ["dstui.execute.injob.ranks", "--nproc", "2", "--master-port", port, "--", sys.executable]
    else:
        launcher = ["deepspeed.launcher.runner", "--num_gpus", "2", "--master_port", port]
    cmd = [sys.executable, "-m", *launcher, str(TRAIN), *args]
    if metrics is not None:
        cmd += ["--metrics-file", str(metrics)]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    return proc, metrics, time.monotonic()


def _smoke_run(home: Path, stage: int) -> Result:
    """Run z<stage> of the shared smoke batch as a Result: its exit code, stdout.log and records."""
    (rd,) = [RunDir(p) for p in (home / "runs").glob(f"smoke-*/z{stage}-r0")]
    st = rd.status()
    wall = (st.get("ended") or 0) - (st.get("started") or 0)
    return Result(st.get("exit_code", -1), rd.log_file.read_text(), read_records(rd.metrics_file), wall)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> dict[str, Result]:
    tmp = tmp_path_factory.mktemp("runner")
    launches: dict[str, list[str]] = {}
    # Standalone: no --ds-config, other paths of the loop (bf16, accumulation, log interval).
    launches["standalone"] = [
        "--model",
        "tiny-gpt2",
        "--dataset",
        "synthetic",
        "--seq-length",
        "32",
        "--steps",
        "4",
        "--warmup-steps",
        "1",
        "--log-interval",
        "2",
        "--grad-accum",
        "2",
        "--micro-batch",
        "2",
        "--dtype",
        "bf16",
        "--zero-stage",
        "2",
        "--torch-adam",
    ]
    # Sequence parallelism (Ulysses, ring, the sp-check, its faults) is tests/e2e/test_sp.py's, in one batch.
    launches["bad_preset"] = ["--model", "tiny-lama", "--steps", "3"]
    # Seq2seq (seed 004 profiled T5): the encoder-decoder path, ZeRO-3 partitions both halves.
    launches["t5"] = [*COMMON, "--model", "tiny-t5", "--zero-stage", "3", "--torch-adam"]

    # These launches run beside the smoke batch (4 runs, one after another), one at a time while
    # it runs and two at a time after: more than two jobs of two ranks each only thrash (load 30
    # seen with all seven at once). Before, the batch ran first and the launches after it: this
    # module was the suite's longest item (709 s of a 1088-s run).
    results: dict[str, Result] = {}
    smoke_done = threading.Event()

    def launch_all() -> None:
        pending = list(launches.items())
        while pending:
            width = MAX_PARALLEL if smoke_done.is_set() else 1
            batch, pending = pending[:width], pending[width:]
            started = {
                name: _start(args, tmp / f"{name}.jsonl", direct=name not in DEEPSPEED_LAUNCHER)
                for name, args in batch
            }
            for name, (proc, metrics, t0) in started.items():
                try:
                    out, _ = proc.communicate(timeout=540)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    out, _ = proc.communicate()
                    out += "\n<test: timed out>"
                records = read_records(metrics) if metrics is not None else []
                results[name] = Result(proc.returncode, out, records, time.monotonic() - t0)

    with ThreadPoolExecutor(1, thread_name_prefix="runner-launches") as pool:
        launched = pool.submit(launch_all)
        try:
            smoke_batch = request.getfixturevalue("smoke_batch")
        finally:
            smoke_done.set()
        launched.result()  # raises what the launches raised
    # The dstui path: the ds_config dstui generated, used as-is by the runner (torch's AdamW:
    # DeepSpeed's would JIT-compile FusedAdam first, minutes on 2 cores)
    assert smoke_batch["returncode"] == 0, smoke_batch["stdout"] + smoke_batch["stderr"]
    for stage in STAGES:
        results[f"z{stage}"] = _smoke_run(Path(smoke_batch["home"]), stage)
    return results


def _ok(r: Result) -> None:
    assert r.rc == 0, r.out[-4000:]


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@pytest.mark.parametrize("stage", STAGES)
def test_zero_stage_records(runs: dict[str, Result], stage: int) -> None:
    r = runs[f"z{stage}"]
    _ok(r)
    (header,) = r.of("header")
    assert header["world_size"] == 2
    assert header["device"] == "cpu" and header["peak_tflops"] is None
    assert header["ds_config"]["zero_optimization"]["stage"] == stage
    assert header["tokens_per_step"] == SMOKE["micro_batch"] * SMOKE["grad_accum"] * SMOKE["seq_length"] * 2
    assert header["params"] > 0 and header["flops_per_token"] > 6 * header["params"]
    assert set(header["versions"]) >= {"deepspeed", "torch", "transformers", "python"}
    assert header["config"]["zero_stage"] == stage

    steps = r.of("step")
    assert [s["step"] for s in steps] == list(range(1, SMOKE["steps"] + 1))
    for s in steps:
        for field in (
            "loss",
            "iter_time",
            "tokens_per_s",
            "tflops_per_gpu",
            "mem_alloc",
            "mem_peak",
            "lr",
        ):
            assert _finite(s[field]), (field, s)
        assert s["iter_time"] > 0 and s["mem_peak"] >= s["mem_alloc"] > 0
        assert "mfu" not in s  # no known peak on CPU: no made-up MFU

    (summary,) = r.of("summary")
    assert summary["status"] == "ok" and summary["steps"] == SMOKE["steps"]
    assert summary["warmup_steps"] == SMOKE["warmup_steps"]
    assert summary["final_loss"] == steps[-1]["loss"]
    for field in (
        "iter_time_mean",
        "iter_time_std",
        "tokens_per_s_mean",
        "compile_time",
        "mem_peak_max",
    ):
        assert _finite(summary[field]), field
    assert r.records[0]["type"] == "header" and r.records[-1]["type"] == "phases"


def test_zero_stages_same_loss(runs: dict[str, Result]) -> None:
    """Same seed, same data: ZeRO partitions the work, not the maths; step 1 must match exactly."""
    for stage in STAGES:
        _ok(runs[f"z{stage}"])
    first = {stage: runs[f"z{stage}"].of("step")[0]["loss"] for stage in STAGES}
    assert len(set(first.values())) == 1, first
    # Later steps agree closely too (reduction order may differ in the last bits).
    last = [runs[f"z{stage}"].of("step")[-1]["loss"] for stage in STAGES]
    assert max(last) - min(last) < 1e-4, last


def test_seed_line_printed(runs: dict[str, Result]) -> None:
    r = runs["z0"]
    _ok(r)
    parsed = [p for p in map(parse_seed_line, r.out.splitlines()) if p]
    assert [p["step"] for p in parsed] == list(range(1, SMOKE["steps"] + 1))  # rank 0 only, once per step
    steps = r.of("step")
    assert parsed[0]["loss"] == pytest.approx(steps[0]["loss"], abs=1e-6)
    assert parsed[-1]["mem_peak"] == steps[-1]["mem_peak"]


def test_standalone_without_ds_config(runs: dict[str, Result]) -> None:
    r = runs["standalone"]
    _ok(r)
    (header,) = r.of("header")
    cfg = header["ds_config"]
    assert cfg["zero_optimization"]["stage"] == 2 and cfg["bf16"]["enabled"] is True
    assert cfg["gradient_accumulation_steps"] == 2 and cfg["train_micro_batch_size_per_gpu"] == 2
    assert "optimizer" not in cfg  # --torch-adam: a client torch.optim.AdamW
    assert header["tokens_per_step"] == 2 * 2 * 32 * 2
    assert [s["step"] for s in r.of("step")] == [2, 4]  # --log-interval 2
    assert all(_finite(s["loss"]) for s in r.of("step"))
    assert r.of("summary")[0]["status"] == "ok"


def test_phases_record_orders_the_life_of_a_run(runs: dict[str, Result]) -> None:
    for name in ("standalone", "z1"):  # DeepSpeed's launcher and dstui's rank starter
        (phases,) = runs[name].of("phases")
        marks = [phases[m] for m in ("process_start", "imports_done", "group_up", "model_built",
                                     "engine_ready", "first_step_done", "last_step_done", "exit")]  # fmt: skip
        assert marks == sorted(marks), phases
        assert runs[name].records[-1]["type"] == "phases"


def test_seq2seq_t5_preset_trains(runs: dict[str, Result]) -> None:
    r = runs["t5"]
    _ok(r)
    (header,) = r.of("header")
    assert header["config"]["model"] == "tiny-t5" and header["params"] > 0
    losses = [s["loss"] for s in r.of("step")]
    assert len(losses) == STEPS and all(_finite(x) for x in losses)
    assert losses[-1] < losses[0]  # it learns to reproduce its input
    assert r.of("summary")[0]["status"] == "ok"


def test_bad_preset_is_a_clear_error(runs: dict[str, Result]) -> None:
    r = runs["bad_preset"]
    assert r.rc != 0
    assert "unknown model 'tiny-lama'" in r.out
    assert "tiny-llama" in r.out and "tiny-gpt2" in r.out  # lists the presets
    assert "Traceback" not in r.out
    assert not r.records


def test_help_explains_every_setting() -> None:
    out = subprocess.run(
        [sys.executable, str(TRAIN), "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    names = [
        n
        for n in Settings.model_fields
        if n
        in {
            "model",
            "load_weights",
            "dataset",
            "dataset_config",
            "dataset_percent",
            "seq_length",
            "micro_batch",
            "grad_accum",
            "steps",
            "warmup_steps",
            "log_interval",
            "dtype",
            "zero_stage",
            "offload",
            "offload_params",
            "nvme_path",
            "deepcompile",
            "compile",
            "activation_checkpointing",
            "sequence_parallel",
            "sp_mode",
            "lr",
            "torch_adam",
            "seed",
            "deterministic",
        }
    ]
    assert len(names) == 25
    for n in names:
        assert "--" + n.replace("_", "-") in out.stdout, n
    assert "--ds-config" in out.stdout and "--metrics-file" in out.stdout
