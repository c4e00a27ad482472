"""ZeRO-3 models built partitioned under deepspeed.zero.Init give the same losses as models built whole.

Real DeepSpeed on 2 gloo ranks (CPU), started by dstui's rank starter. The
old path is the same runner with ``DSTUI_ZERO_INIT=0`` (runners/placement.py):
the model built whole on the host, partitioned by deepspeed.initialize.
ZeRO 1 and 2 build through the very same host path as ZeRO 0 on the CPU, and
tests/e2e/test_runner.py compares the step-1 loss of all four stages.

All launches run in one module fixture, two at a time (start-up dominates).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dstui.core.record_file import read_records
from dstui.execute.launch import free_port

# one worker runs the module fixture (under xdist each worker would run its own copy)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800), pytest.mark.xdist_group("zero-init")]

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "runners" / "train.py"
RANKS = Path(__file__).resolve().parent / "zero_init_ranks.py"
RUN = ["--dataset", "tiny-corpus", "--seq-length", "64", "--steps", "2", "--warmup-steps", "1",
       "--seed", "7", "--torch-adam"]  # fmt: skip
LLAMA = ["--model", "tiny-llama", *RUN]
# bf16 (the partitions are cast after an fp32 build) and dropout (T5: every rank's generator must
# be where a whole-model build leaves it).
T5_BF16 = ["--model", "tiny-t5", *RUN, "--zero-stage", "3", "--dtype", "bf16"]
OLD = {"DSTUI_ZERO_INIT": "0"}
LAUNCHES: dict[str, tuple[list[str], dict[str, str]]] = {
    "z0": ([*LLAMA, "--zero-stage", "0"], {}),
    "z3": ([*LLAMA, "--zero-stage", "3"], {}),
    "z3_old": ([*LLAMA, "--zero-stage", "3"], OLD),
    "t5_bf16": (T5_BF16, {}),
    "t5_bf16_old": (T5_BF16, OLD),
    # Ulysses: zero.Init partitions over the sequence-data-parallel group; --sp-check builds a
    # second model in the same process (its twin run without SP), under zero.Init too.
    "sp": ([*LLAMA, "--zero-stage", "3", "--sequence-parallel", "2", "--sp-check"], {}),
}


def _start(program: list[str], env_extra: dict[str, str]) -> subprocess.Popen:
    env = {
        k: v for k, v in os.environ.items() if k not in ("DSTUI_METRICS_FILE", "DSTUI_ZERO_INIT")
    }
    env.update(OMP_NUM_THREADS="1", **env_extra)  # one thread per rank: launches share two cores
    ranks = ["-m", "dstui.execute.injob.ranks", "--nproc", "2", "--master-port", str(free_port()), "--"]
    return subprocess.Popen(
        [sys.executable, *ranks, sys.executable, *program],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, list[dict]]]:
    """name -> (exit code, output, rank-0 records); "ranks" is zero_init_ranks.py (its JSON lines)."""
    tmp = tmp_path_factory.mktemp("zero_init")
    programs = {"ranks": ([str(RANKS), str(tmp)], {})}
    for name, (args, env) in LAUNCHES.items():
        programs[name] = ([str(TRAIN), *args, "--metrics-file", str(tmp / f"{name}.jsonl")], env)
    results = {}
    pending = list(programs.items())
    while pending:
        batch, pending = pending[:2], pending[2:]
        started = {name: _start(program, env) for name, (program, env) in batch}
        for name, proc in started.items():
            try:
                out, _ = proc.communicate(timeout=600)
            except subprocess.TimeoutExpired:
                proc.kill()
                out = proc.communicate()[0] + "\n<test: timed out>"
            metrics = tmp / f"{name}.jsonl"
            records = read_records(metrics) if metrics.exists() else []
            if name == "ranks":
                records = [
                    json.loads(line) for line in out.splitlines() if line.startswith('{"case"')
                ]
            results[name] = (proc.returncode, out, records)
    return results


def _ok(runs: dict, name: str) -> list[dict]:
    rc, out, records = runs[name]
    assert rc == 0, out[-4000:]
    return records


def _of(records: list[dict], kind: str) -> list[dict]:
    return [r for r in records if r["type"] == kind]


def _losses(runs: dict, name: str) -> list[float]:
    return [s["loss"] for s in _of(_ok(runs, name), "step")]


def test_every_preset_builds_bit_identical_under_zero_init(runs: dict) -> None:
    """Parameters, buffers and the generator state after the build, per preset and dtype, loaded weights too."""
    cases = {c["case"]: c for c in _ok(runs, "ranks")}
    assert set(cases) == {f"{m}/{d}" for d in ("fp32", "bf16") for m in
                          ("tiny-llama", "tiny-llama-shared", "tiny-gpt2", "tiny-t5", "load-weights")}  # fmt: skip
    for c in cases.values():
        assert c["method"] == "zero.Init" and c["partitioned"], c
        assert c["identical"] and c["rng_same"], c


def test_zero3_is_partitioned_when_built(runs: dict) -> None:
    (header,) = _of(_ok(runs, "z3"), "header")
    init = header["model_init"]
    assert init["method"] == "zero.Init" and "zero_init_off" not in init
    assert init["params"] == header["params"] > 0
    assert init["params"] // 2 <= init["params_on_rank"] < 0.6 * init["params"]  # rank 0's half
    (old,) = _of(_ok(runs, "z3_old"), "header")
    assert old["model_init"] == {"method": "host", "params": header["params"],
                                 "params_on_rank": header["params"], "zero_init_off": "DSTUI_ZERO_INIT=0"}  # fmt: skip
    (z0,) = _of(_ok(runs, "z0"), "header")
    assert z0["model_init"]["method"] == "host" and "zero_init_off" not in z0["model_init"]


def test_same_seed_same_losses_as_the_whole_model_build(runs: dict) -> None:
    new, old, z0 = _losses(runs, "z3"), _losses(runs, "z3_old"), _losses(runs, "z0")
    assert len(new) == 2
    assert new[0] == old[0] == z0[0]  # bit for bit
    assert new == old  # same build, same engine: step 2 too


def test_bf16_and_dropout_same_losses(runs: dict) -> None:
    new, old = _losses(runs, "t5_bf16"), _losses(runs, "t5_bf16_old")
    assert len(new) == 2 and new == old
    (header,) = _of(_ok(runs, "t5_bf16"), "header")
    assert header["model_init"]["method"] == "zero.Init" and header["ds_config"]["bf16"]["enabled"]


def test_sequence_parallel_zero3_builds_under_zero_init(runs: dict) -> None:
    records = _ok(runs, "sp")
    (header,) = _of(records, "header")
    assert header["sequence_parallel"] == 2 and header["model_init"]["method"] == "zero.Init"
    assert header["model_init"]["params_on_rank"] < header["params"]
    (verdict,) = [s for s in _of(records, "summary") if s.get("check") == "sp-check"]
    assert verdict["verdict"] == "PASS", runs["sp"][1][-3000:]
