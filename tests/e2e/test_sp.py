"""Sequence parallelism through `dstui run` on CPU: 2 gloo ranks of tiny-llama, every mode checked, faults caught.

One batch (module fixture): Ulysses eager and torch.compile, torch.compile again without the
sp-check, ring attention, and three injected faults (a wrong head split after the all-to-all
and over the ring, a sequence shard handed to the wrong rank), each through the sp-check.
Then `dstui report` on the batch. DeepCompile is refused on this machine before anything launches.

Kept cheap (every launch costs ~12 CPU-s of imports on 2 ranks, the compiled one ~70 more):
tiny-llama at 64 tokens, two steps (two logged losses: the loss check compares a trained step,
not only the initial weights), one step for a fault (the tensor check decides at step 1). The
compiled run without the check repeats the checked one's graphs, which it finds in the batch's
Inductor cache. No no-SP condition: the report's pairing of an SP run with a measured no-SP
condition is tests/unit/test_sp_report.py's (over a real MLflow store), a plain run test_runner's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from helpers import dstui

from dstui.core.record_file import read_records
from dstui.core.rundir import RunDir

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800), pytest.mark.xdist_group("sp")]

INJECT = ["--sp-rtol", "1e-5", "--sp-inject"]  # a given loss tolerance: no noise run for a run meant to fail
FAULT = {"steps": 1, "warmup_steps": 0}
# Inductor compiles in the rank itself: no pool of compile workers (each one a torch import) per rank on 2 cores
COMPILED = {"sp_mode": "compile", "env": {"TORCHINDUCTOR_COMPILE_THREADS": "1"}}
SPEC = {
    "name": "sp-e2e",
    "settings": {"model": "tiny-llama", "dataset": "tiny-corpus", "seq_length": 64, "micro_batch": 1, "steps": 2,
                 "warmup_steps": 1, "dtype": "fp32", "gpus": 2, "zero_stage": 1, "sequence_parallel": 2,
                 "sp_check": True, "torch_adam": True, "seed": 7,
                 # step 1 of the compiled run prints nothing while Inductor compiles: 178 s under load 10, 272 s under 20
                 "hung_after_s": 900},
    "conditions": [
        {"name": "eager", "sp_mode": "eager"},
        {"name": "compile", **COMPILED},
        {"name": "compile-unchecked", **COMPILED, "sp_check": False},
        {"name": "ring", "sp_mode": "ring"},
        {"name": "head-split", "sp_mode": "eager", **FAULT, "extra_args": [*INJECT, "head-split"]},
        {"name": "shard-offset", "sp_mode": "eager", **FAULT, "extra_args": [*INJECT, "shard-offset"]},
        {"name": "ring-head-split", "sp_mode": "ring", **FAULT, "extra_args": [*INJECT, "head-split"]},
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> dict:
    home = tmp_path_factory.mktemp("sp-home")
    (home / "mlruns").mkdir()
    shutil.copy(request.getfixturevalue("empty_db"), home / "mlruns" / "mlflow.db")
    # the compile caches too: this batch's own (not the machine's, which other sessions write and kill)
    env = {"DSTUI_HOME": str(home), "MLFLOW_TRACKING_URI": f"sqlite:///{home}/mlruns/mlflow.db",
           "DSTUI_PRIVATE_DIR": str(home / "private"), "DSTUI_CACHE": str(home / "cache")}  # fmt: skip
    spec = home / "sp.yaml"
    spec.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    run = dstui("run", "--quiet", str(spec), env=env, timeout=1500)
    (folder,) = (home / "runs").glob("sp-e2e-*")
    runs = {}
    for cond in SPEC["conditions"]:
        rd = RunDir(folder / f"{cond['name']}-r0")
        records = read_records(rd.metrics_file) if rd.metrics_file.exists() else []
        summaries = [r for r in records if r.get("type") == "summary"]
        runs[cond["name"]] = {"status": rd.status(), "log": rd.log_file.read_text(errors="replace"),
                              "header": next((r for r in records if r.get("type") == "header"), {}),
                              "losses": [r["loss"] for r in records if r.get("type") == "step"],
                              "summary": next((r for r in summaries if "check" not in r), {}),
                              "check": next((r for r in summaries if r.get("check") == "sp-check"), {})}  # fmt: skip
    report = dstui("report", "-e", "sp-e2e", "-b", folder.name, "-o", str(home / "report"), env=env, timeout=600)
    return {"run": run, "runs": runs, "report": report, "home": home, "env": env}


@pytest.mark.parametrize("mode", ["eager", "compile", "ring"])
def test_each_mode_passes_the_tensor_and_the_loss_check(batch: dict, mode: str) -> None:
    r = batch["runs"][mode]
    assert r["status"].get("state") == "done", r["log"][-3000:]
    check = r["check"]
    assert check["verdict"] == "PASS" and check["tensor_verdict"] == "PASS", r["log"][-3000:]
    assert check["tensor_layers"] == [0, 1] and "first_difference" not in check
    assert "sp-check: tensors match at step 1" in r["log"] and "sp-check: losses match" in r["log"]
    assert check["tensor_max_rel"] is not None and check["tensor_max_rel"] < 1e-5  # fp32: rounding only
    # the loss tolerance is derived from a measured noise run, and the SP losses sit well inside it
    assert "tolerance derived: max(4 x measured noise" in r["log"]
    assert check["margin"] is None or check["margin"] > 1
    # the no-SP run timed alongside, compiled the way the SP run is
    assert check["nosp_mode"] == ("torch.compile" if mode == "compile" else "eager")
    assert check["nosp_iter_time_mean"] > 0 and check["nosp_tokens_per_s_mean"] > 0


def test_the_sp_run_records_its_shape(batch: dict) -> None:
    header = batch["runs"]["eager"]["header"]
    assert header["sequence_parallel"] == 2 and header["dp_world_size"] == 1
    assert header["ds_config"]["sequence_parallel_size"] == 2
    assert header["tokens_per_step"] == 64  # one 64-token sequence shared by the two ranks
    assert len(batch["runs"]["eager"]["losses"]) == SPEC["settings"]["steps"]


def test_the_check_changes_nothing_that_is_compiled_or_measured(batch: dict) -> None:
    """The tensor capture runs before the engine is compiled: same graphs, no recompile, same losses."""
    checked, unchecked = batch["runs"]["compile"], batch["runs"]["compile-unchecked"]
    assert unchecked["status"].get("state") == "done", unchecked["log"][-3000:]
    assert not unchecked["check"] and "sp-check" not in unchecked["log"]
    counts = {k: v for k, v in checked["summary"].items() if k.startswith("dynamo_")}
    assert set(counts) == {"dynamo_frames", "dynamo_graphs", "dynamo_graph_breaks", "dynamo_ops"}, checked["summary"]
    assert counts == {k: v for k, v in unchecked["summary"].items() if k.startswith("dynamo_")}
    # one graph for forward and backward: the capture added no graph break, and step 2 recompiled nothing
    assert counts["dynamo_graphs"] == 1 and counts["dynamo_graph_breaks"] == 0 and counts["dynamo_ops"] > 0
    assert checked["losses"] == unchecked["losses"] and len(checked["losses"]) == 2  # bit for bit (CPU, fp32)
    # and the very same graphs: the run without the check (after it, same Inductor cache) compiled none anew
    assert unchecked["summary"].get("compile_cache_fxgraph_hit", 0) > 0, unchecked["summary"]
    assert unchecked["summary"].get("compile_cache_fxgraph_miss", 0) == 0, unchecked["summary"]


@pytest.mark.parametrize(
    ("fault", "stage", "tensor"),
    [
        ("head-split", "after the all-to-all", "v"),
        ("shard-offset", "before the all-to-all", "q"),
        ("ring-head-split", "received over the ring", "v"),
    ],
)
def test_an_injected_fault_fails_at_step_1_naming_layer_and_stage(batch: dict, fault: str, stage: str, tensor: str) -> None:
    r = batch["runs"][fault]
    assert r["status"].get("state") == "failed" and r["status"].get("verdict") == "FAIL", r["log"][-3000:]
    check = r["check"]
    assert check["tensor_verdict"] == "FAIL" and check["first_diverging_step"] == 1
    first = check["first_difference"]
    assert (first["layer"], first["stage"], first["tensor"]) == (0, stage, tensor)
    assert first["rel"] > 0.1 > first["tol"]  # order 1 against a 1e-5 floor: far outside, not marginal
    assert f"sp-check: tensors DIFFER at step 1: first at layer 0, {tensor} {stage}" in r["log"]
    assert check["reason"].startswith(f"tensors differ at step 1, first at layer 0, {tensor} {stage}")
    # the loss check sees it too: the step-1 loss is outside the given tolerance
    assert "sp-check: losses DIFFER" in r["log"] and check["margin"] < 1


def test_the_batch_says_which_runs_failed(batch: dict) -> None:
    assert batch["run"].returncode == 1  # the three faults: the run command reports failed runs
    assert "4/7 runs done" in batch["run"].stdout, batch["run"].stdout[-2000:]


def test_the_report_sets_each_mode_beside_the_no_sp_run(batch: dict) -> None:
    assert batch["report"].returncode == 0, batch["report"].stderr[-3000:]
    md = (batch["home"] / "report" / "report.md").read_text()
    assert "## Sequence parallelism" in md and "3 of 6 checked runs PASS" in md
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in md.splitlines() if line.startswith("| `")}
    # each beside the sp-check's own no-SP run (same ranks and sequence; compiled for the compiled mode)
    assert "| Ulysses eager | 2 x 1 | 1 | 64 |" in rows["`eager-r0`"]
    assert "| Ulysses torch.compile | 2 x 1 | 1 | 64 |" in rows["`compile-r0`"]
    assert "| ring attention | 2 x 1 | 1 | 64 |" in rows["`ring-r0`"]
    for run in ("eager", "compile", "ring"):
        assert "| sp-check's no-SP run | **PASS** |" in rows[f"`{run}-r0`"], rows[f"`{run}-r0`"]
    assert "first at layer 0, v after the all-to-all" in rows["`head-split-r0`"]


def test_deepcompile_is_refused_on_this_machine_for_the_cpu_reason(batch: dict, tmp_path: Path) -> None:
    spec = tmp_path / "dc.yaml"
    spec.write_text(yaml.safe_dump({**SPEC, "name": "sp-dc", "conditions": [{"name": "dc", "sp_mode": "deepcompile"}]}))
    proc = dstui("run", str(spec), env=batch["env"], timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "DeepCompile needs a CUDA GPU; this machine has none" in proc.stderr and "Traceback" not in proc.stderr
    assert not list((batch["home"] / "runs").glob("sp-dc-*"))  # refused before anything is built
