"""ZeRO vs plain PyTorch parity runner (runners/compare_loss.py, seed 002).

Unit tests of the comparison semantics run in-process. The ``e2e`` tests start
two gloo ranks on the CPU with dstui's rank starter (as ``dstui run`` does). They are launched
together on first use (two at a time: each job holds ~2 GB of RSS), so the
whole module costs a few launches' worth of wall time, not one per test.

Exactness findings (DeepSpeed 0.19.8, torch 2.13 CPU, 2 ranks, fp32, torch AdamW):

* ZeRO-1 and ZeRO-2 equal the PyTorch baseline bit for bit: loss, every
  gradient and every parameter, at every step.
* ZeRO-3 does *not*, against a plain baseline. The loss is equal, but from
  step 1 most gradients differ by a few ulps (max ~1e-8), which Adam's
  normalisation turns into parameter differences up to ~1e-5. Cause: ZeRO-3
  wraps the tensor inputs and outputs of every module in identity autograd
  Functions (PostBackwardFunctionModule / PreBackwardFunctionForModule in
  deepspeed/runtime/zero/parameter_offload.py) to know when a module's
  backward runs. Values are unchanged, but the grouping in which autograd sums
  the gradient of a tensor with three or more uses changes: the residual
  stream feeds the residual add and an RMSNorm that uses its input twice, and
  ``r + (p + m) != (r + m) + p`` in floating point. The pattern proves it:
  lm_head, the final norm, the last layer's MLP and its post-attention norm
  are exact (their gradients are formed before the first three-way fan-in);
  everything from the last layer's attention down differs. The same identity
  wrappers on a model without DeepSpeed reproduce exactly this set, and with
  ``--mirror-zero3-hooks`` (the baseline wrapped like ZeRO-3 wraps the
  engine's model) ZeRO-3 matches bit for bit. Partitioning, reduce-scatter
  and all-gather are therefore exact; only the autograd graph differs.
  A single-rank ZeRO-3 run (no communication at all) shows the same
  differences. Reduction order is not the cause with two ranks: ``a + b`` is commutative
  and dividing by 2 is exact, wherever DeepSpeed places the averaging.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import RunnerModule
from parity_jobs import Job, finished, jobs_fixture, uses

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "runners"))


parity = RunnerModule("parity")  # torch at first use, not at every worker's collection

# one xdist worker runs the module in order: the e2e tests read jobs one module fixture launches together
pytestmark = pytest.mark.xdist_group("compare-loss")

EXACT = ["--torch-adam", "--dtype", "fp32", "--rtol", "0", "--atol", "0", "--steps", "3"]
# A tolerance far above rounding noise: the injected faults must stand out from
# noise, not only from exact equality.
TOL = ["--torch-adam", "--rtol", "1e-5", "--atol", "1e-8"]

CASES: dict[str, list[str]] = {
    "z1": ["--zero-stage", "1", *EXACT],
    "z2": ["--zero-stage", "2", *EXACT],
    "z3": ["--zero-stage", "3", "--tolerance", "exact", *EXACT],
    "z3_mirror": ["--zero-stage", "3", "--mirror-zero3-hooks", *EXACT],
    # the seed's own spellings, on purpose
    "inject_lr": ["--zero_stage", "2", "--dtype", "torch.float32", "--steps", "2", "--inject", "lr",
                  *TOL],
    "inject_grad": ["--zero-stage", "1", "--steps", "4", "--inject", "grad", "--inject-step", "3",
                    *TOL],
}

# Where ZeRO bugs live: accumulation 4, overlapped communication, many small buckets, a model
# with tied embeddings and a layer applied twice per step (tiny-llama-shared).
RECIPE = ["--model", "tiny-llama-shared", "--seq-length", "32", "--steps", "3", "--torch-adam"]


def recipe_config(stage: int, **extra: object) -> dict:
    """A ds_config like dstui generates for a verify condition with these ds_overrides."""
    return {
        "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
        "steps_per_print": 10**9, "gradient_clipping": 0.0, "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": stage, "overlap_comm": True, "contiguous_gradients": True,
                              "reduce_bucket_size": 20000, "allgather_bucket_size": 20000,
                              **({"stage3_prefetch_bucket_size": 20000,
                                  "stage3_param_persistence_threshold": 100} if stage == 3 else {})},
        **extra,
    }  # fmt: skip


#: name -> (ds_config, $DSTUI_PARITY_INJECT or None); argv is RECIPE (+ CASE_ARGS)
RECIPES: dict[str, tuple[dict, str | None]] = {
    "ga4_z2_clean": (recipe_config(2), None),
    "ga4_z2_drop_bucket": (recipe_config(2), "drop_bucket:step=2:bucket=1"),
    "ga4_z1_double_grad": (recipe_config(1), "double_grad:step=2"),
    "ga4_z3_skip_gas": (recipe_config(3), "skip_gas_scaling:step=2"),
    "ga4_z1_bf16_clip": (recipe_config(1, bf16={"enabled": True}, gradient_clipping=0.5), None),
    # clipping on every step (norms ~1 against 0.01) rescales a wrong gradient to the right length
    "ga4_z2_clip_gas_twice": (recipe_config(2, gradient_clipping=0.01), "gas_scaled_twice:step=2"),
    "ga4_z2_clip_norm_doubled": (recipe_config(2, gradient_clipping=0.01), "norm_doubled:step=2"),
}
# the same case in a launch of its own: what a case run after others in shared ranks is held to
RECIPES["ga4_z2_clip_norm_doubled_alone"] = RECIPES["ga4_z2_clip_norm_doubled"]
CASE_ARGS = {"ga4_z3_skip_gas": ["--mirror-zero3-hooks"]}
for _name in RECIPES:
    CASES[_name] = [*RECIPE, *CASE_ARGS.get(_name, [])]


# -- unit tests (no process group) ---------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [("fp32", "fp32"), ("torch.float32", "fp32"), ("torch.bfloat16", "bf16"),
     ("BF16", "bf16"), ("torch.float16", "fp16"), ("half", "fp16")],
)
def test_dtype_aliases(text: str, want: str) -> None:
    assert parity.canonical_dtype(text) == want


def test_unknown_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown dtype"):
        parity.canonical_dtype("int8")


def test_option_names_dash_first_then_seed_spelling() -> None:
    assert parity.option_names("zero_stage") == ["--zero-stage", "--zero_stage"]
    assert parity.option_names("lr") == ["--lr"]
    assert parity.option_names("torch_adam", "--use_torch_adam") == [
        "--torch-adam", "--torch_adam", "--use_torch_adam"]


def test_zero_tolerance_means_bit_equality() -> None:
    import torch

    a = torch.tensor([1.0, 2.0, 3.0])
    b = a.clone()
    d = parity.compare_named([("w", a, b)], rtol=0.0, atol=0.0)
    assert d.ok and d.max_abs == 0.0 and d.max_rel == 0.0
    b[1] = torch.nextafter(b[1], torch.tensor(10.0))  # one ulp
    d = parity.compare_named([("w", a, b)], rtol=0.0, atol=0.0)
    assert not d.ok and d.max_abs > 0 and d.offenders[0][:1] == ("w",)
    assert parity.compare_named([("w", a, b)], rtol=1e-6, atol=0.0).ok


def test_nan_is_never_close_and_rel_diff_stays_finite() -> None:
    import math

    import torch

    d = parity.compare_named([("w", torch.tensor([float("nan")]), torch.tensor([float("nan")]))],
                             rtol=1.0, atol=1.0)
    assert not d.ok and d.max_abs == math.inf
    d = parity.compare_named([("z", torch.tensor([1e-3]), torch.tensor([0.0]))], rtol=0.0, atol=0.0)
    assert not d.ok and math.isfinite(d.max_rel) and d.max_rel > 1e30


def test_scalar_diff_uses_allclose_rule() -> None:
    assert parity.scalar_diff(1.0, 1.0, 0.0, 0.0) == (0.0, True)
    assert parity.scalar_diff(1.0 + 1e-7, 1.0, 1e-6, 0.0)[1]
    assert not parity.scalar_diff(1.1, 1.0, 1e-6, 1e-6)[1]


def test_synthetic_batches_are_a_function_of_seed_and_step() -> None:
    import torch

    a = parity.synthetic_batch(1, 2, global_batch=4, seq_length=8, vocab_size=50)
    torch.manual_seed(123)  # the global RNG must not matter
    b = parity.synthetic_batch(1, 2, global_batch=4, seq_length=8, vocab_size=50)
    assert torch.equal(a, b)
    assert not torch.equal(a, parity.synthetic_batch(1, 3, global_batch=4, seq_length=8, vocab_size=50))
    assert torch.equal(parity.rank_slice(a, 1, 2), a[2:4])


def test_verdict_line() -> None:
    assert parity.verdict_line(None, "") == "PASS"
    assert parity.verdict_line(3, "grad") == "FAIL (first diverging step 3: grad)"


# -- end to end: the real launcher, two gloo ranks -----------------------------


jobs = jobs_fixture(CASES, RECIPES, alone=("ga4_z2_clip_norm_doubled_alone",))
_finished = finished


def _failed_at_step_2(jobs: dict[str, Job], case: str) -> tuple[Job, dict, dict[int, dict]]:
    """A fault case (injected at step 2): FAIL first at step 2 after a step 1 within tolerance.
    Returns (job, summary, step records by step)."""
    job = _finished(jobs, case)
    summary = job.summary()
    steps = {r["step"]: r for r in job.records("step")}
    assert job.returncode == 1, job.output[-4000:]
    assert summary["verdict"] == "FAIL" and summary["first_diverging_step"] == 2, job.output[-4000:]
    assert steps[1]["within_tol"] == 1
    return job, summary, steps


def _assert_exact(job: Job) -> None:
    summary = job.summary()
    steps = job.records("step")
    assert job.returncode == 0, f"{job.name}: exit {job.returncode}\n{job.output[-4000:]}"
    assert summary["verdict"] == "PASS" and summary["first_diverging_step"] is None
    assert summary["status"] == "ok"
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert r["within_tol"] == 1
        for key in ("loss_abs_diff", "grad_max_abs_diff", "grad_max_rel_diff",
                    "param_max_abs_diff", "param_max_rel_diff"):
            assert r[key] == 0.0, (job.name, r["step"], key, r[key])
        assert r["loss"] == r["loss_baseline"]
    # the parameters did move: equality is not an untrained artefact
    assert steps[0]["loss"] != steps[-1]["loss"]
    assert job.output.rstrip().endswith("PASS") or "\nPASS\n" in job.output


@pytest.mark.e2e
@pytest.mark.parametrize("case", ["z1", "z2"])
def test_zero_1_and_2_match_pytorch_exactly(jobs: dict[str, Job], case: str) -> None:
    _assert_exact(_finished(jobs, case))


@pytest.mark.e2e
@pytest.mark.xfail(
    strict=True,
    reason="ZeRO-3's identity autograd wrappers around every module's inputs/outputs regroup the "
           "summation of gradients of tensors with >= 3 uses (residual + RMSNorm), so gradients "
           "differ by a few ulp from an unwrapped model; see the module docstring and "
           "test_zero3_matches_exactly_when_baseline_mirrors_its_hooks",
)
@uses("z3")
def test_zero3_matches_plain_pytorch_exactly(jobs: dict[str, Job]) -> None:
    _assert_exact(_finished(jobs, "z3"))


@pytest.mark.e2e
@uses("z3")
def test_zero3_differs_from_plain_pytorch_only_by_gradient_summation_order(jobs: dict[str, Job]) -> None:
    """Pin the finding itself: equal loss at step 1, ulp-level gradient differences."""
    job = _finished(jobs, "z3")
    first = job.records("step")[0]
    assert job.returncode == 1 and job.summary()["first_diverging_step"] == 1
    assert first["loss_abs_diff"] == 0.0  # the forward pass is identical
    assert 0.0 < first["grad_max_abs_diff"] < 1e-6  # rounding, not a bug-sized error
    out = job.output
    assert "grad lm_head.weight" not in out and "grad model.norm.weight" not in out
    assert "grad model.layers.1.self_attn.o_proj.weight" in out


@pytest.mark.e2e
@uses("z3_mirror")
def test_zero3_matches_exactly_when_baseline_mirrors_its_hooks(jobs: dict[str, Job]) -> None:
    _assert_exact(_finished(jobs, "z3_mirror"))


@pytest.mark.e2e
@uses("inject_lr")
def test_wrong_learning_rate_is_caught_at_step_1(jobs: dict[str, Job]) -> None:
    job = _finished(jobs, "inject_lr")
    summary = job.summary()
    assert job.returncode == 1, job.output[-4000:]
    assert summary["verdict"] == "FAIL" and summary["first_diverging_step"] == 1
    first = job.records("step")[0]
    # step 1: same forward and gradients, different update
    assert first["loss_within_tol"] == 1 and first["grad_within_tol"] == 1
    assert first["param_within_tol"] == 0 and first["within_tol"] == 0
    assert "FAIL (first diverging step 1:" in job.output


@pytest.mark.e2e
@uses("inject_grad")
def test_perturbed_gradient_is_caught_at_its_step(jobs: dict[str, Job]) -> None:
    job = _finished(jobs, "inject_grad")
    summary = job.summary()
    steps = {r["step"]: r for r in job.records("step")}
    assert job.returncode == 1, job.output[-4000:]
    assert summary["verdict"] == "FAIL" and summary["first_diverging_step"] == 3
    assert steps[1]["within_tol"] == 1 and steps[2]["within_tol"] == 1
    assert steps[3]["grad_within_tol"] == 0 and steps[3]["loss_within_tol"] == 1
    assert "FAIL (first diverging step 3:" in job.output


@pytest.mark.e2e
@uses("z1")
def test_header_records_versions_and_world(jobs: dict[str, Job]) -> None:
    job = _finished(jobs, "z1")
    (header,) = job.records("header")
    assert header["world_size"] == 2 and header["hostname"]
    assert set(header["versions"]) >= {"deepspeed", "torch", "transformers", "python"}
    assert header["ds_config"]["zero_optimization"]["stage"] == 1
    assert header["config"]["torch_adam"] is True
    assert "Epoch 1, Step 3, Loss:" in job.output  # the seed's line, for line followers


# -- where ZeRO bugs live: accumulation 4, overlap_comm, many buckets, tied + reused modules ----


def _injected_names(job: Job) -> set[str]:
    """The parameters parity_inject says it touched (``parity_inject: <fault> ...: a, b``)."""
    names: set[str] = set()
    for line in job.output.splitlines():
        if line.startswith("parity_inject:") and ": " in line[len("parity_inject:"):]:
            names.update(n.strip() for n in line.rsplit(": ", 1)[1].split(","))
    return names


@pytest.mark.e2e
@uses("ga4_z2_clean")
def test_accumulation_overlap_many_buckets_tied_and_reused_modules_are_bit_exact(jobs: dict[str, Job]) -> None:
    job = _finished(jobs, "ga4_z2_clean")
    _assert_exact(job)
    summary = job.summary()
    assert summary["tolerance"] == 0.0 and summary["tolerance_basis"].startswith("bit-exact")
    assert summary["worst"] == []  # nothing differs at all
    (header,) = job.records("header")
    assert header["config"]["grad_accum"] == 4 and header["ds_config"]["zero_optimization"]["overlap_comm"]
    for r in job.records("step"):
        assert r["grad_norm"] == pytest.approx(r["grad_norm_baseline"], rel=1e-6) and r["grad_norm"] > 0


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("case", "fault"),
    [("ga4_z2_drop_bucket", "drop_bucket"), ("ga4_z1_double_grad", "double_grad"),
     ("ga4_z3_skip_gas", "skip_gas_scaling")],
)
def test_injected_reduction_fault_fails_at_its_step_naming_the_parameters(
    jobs: dict[str, Job], case: str, fault: str
) -> None:
    job, summary, steps = _failed_at_step_2(jobs, case)
    assert steps[2]["grad_within_tol"] == 0
    assert f"parity_inject: {fault}" in job.output
    worst = summary["worst"]
    assert worst and {w["kind"] for w in worst} <= {"grad", "param"}
    assert all(w["max_abs_diff"] > 0 for w in worst)
    if fault != "skip_gas_scaling":  # a bucket fault touches named parameters only
        touched = _injected_names(job)
        assert touched and {w["name"] for w in worst} <= touched, (worst, touched)
    assert "FAIL (first diverging step 2:" in job.output


@pytest.mark.e2e
@uses("ga4_z1_bf16_clip")
def test_bf16_masters_with_clipping_pass_within_a_tolerance_measured_from_noise(jobs: dict[str, Job]) -> None:
    job = _finished(jobs, "ga4_z1_bf16_clip")
    summary = job.summary()
    steps = job.records("step")
    assert job.returncode == 0 and summary["verdict"] == "PASS", job.output[-4000:]
    assert summary["tolerance_basis"].startswith("measured") and "bf16" in summary["tolerance_basis"]
    assert summary["tolerance"] > 0
    assert all(r["noise_grad_rel"] > 0 for r in steps)
    # the comparison is not vacuous: the sides do differ, and clipping was engaged
    assert max(r["grad_max_abs_diff"] for r in steps) > 0
    assert all(r["grad_norm"] > 0.5 for r in steps)


@pytest.mark.e2e
@uses("ga4_z2_clip_gas_twice")
def test_clipping_cannot_hide_a_wrongly_scaled_gradient(jobs: dict[str, Job]) -> None:
    """1/GAS applied twice, clipped to the same length as the right gradient: the same update, still a FAIL."""
    _, summary, steps = _failed_at_step_2(jobs, "ga4_z2_clip_gas_twice")
    # both sides clipped at every step: the applied updates are the same length, the pre-clip ratio is 1/GAS
    assert all(r["grad_norm_baseline"] > 0.01 * 10 for r in steps.values())
    assert steps[2]["grad_norm_ratio"] == pytest.approx(0.25, rel=1e-3)
    assert "uniform scale 0.2500 = 1/GAS" in summary["reason"], summary["reason"]


@pytest.mark.e2e
@uses("ga4_z2_clip_norm_doubled")
def test_a_wrong_clipping_norm_fails_though_the_gradients_agree(jobs: dict[str, Job]) -> None:
    job, summary, steps = _failed_at_step_2(jobs, "ga4_z2_clip_norm_doubled")
    assert "parity_inject: norm_doubled at step 2" in job.output
    assert steps[1]["grad_norm_rel_diff"] < 1e-5
    assert steps[2]["grad_norm_rel_diff"] == pytest.approx(1.0, rel=1e-4)
    assert steps[2]["grad_norm_ratio"] == pytest.approx(1.0, abs=1e-5)  # the gradient before clipping is right
    assert "the gradients agree, the norm DeepSpeed clipped by does not" in summary["reason"], summary["reason"]


# what the machine's state and timing decide, not the arithmetic
TIMING = {"time", "iter_time", "tokens_per_s", "mem_alloc", "mem_peak", "iter_time_mean", "iter_time_std",
          "tokens_per_s_mean", "compile_time", "mem_peak_max"}


@pytest.mark.e2e
@uses("ga4_z1_double_grad", "ga4_z2_clip_norm_doubled", "ga4_z2_clip_norm_doubled_alone")
def test_a_case_run_beside_others_gives_the_bits_it_gives_alone(jobs: dict[str, Job]) -> None:
    """``compare_loss.py --cases``: a case run after others in the same ranks (a fault injected in one of
    them) records the same loss, gradients, parameters and verdict, bit for bit, as a launch of its own."""
    shared, alone = finished(jobs, "ga4_z2_clip_norm_doubled"), finished(jobs, "ga4_z2_clip_norm_doubled_alone")
    assert shared.position >= 1 and not alone.position  # ranks that had already run another case
    assert shared.returncode == alone.returncode == 1, shared.output[-2000:] + alone.output[-2000:]

    def arithmetic(job: Job, kind: str) -> list[dict]:
        records = [{k: v for k, v in r.items() if k not in TIMING} for r in job.records(kind)]
        for r in records:  # the files the two jobs were given
            r.get("config", {}).pop("ds_config", None), r.get("config", {}).pop("metrics_file", None)
        return records

    assert len(arithmetic(shared, "step")) == 3
    for kind in ("header", "step", "summary"):
        assert arithmetic(shared, kind) == arithmetic(alone, kind), kind
    verdict = [line for line in alone.output.splitlines() if line.startswith("FAIL (")]
    assert len(verdict) == 1 and verdict[0] in shared.output.splitlines()


# -- through the pipeline: `kind: verify` conditions, verdicts in MLflow ---------------------


@pytest.mark.e2e
def test_verify_conditions_through_the_pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PASS (ZeRO-3, mirrored hooks, zero tolerance) and a deliberate FAIL, via `dstui run`."""
    import yaml
    from helpers import SPECS, dstui, mlflow_client

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    data = yaml.safe_load((SPECS / "verify_zero.yaml").read_text())
    data["settings"]["steps"] = 3
    data["conditions"] = [
        {"name": "z3", "zero_stage": 3, "mirror_zero3_hooks": True},
        {"name": "z1-broken", "zero_stage": 1, "extra_args": ["--inject", "lr"]},
    ]
    spec = tmp_path / "verify.yaml"
    spec.write_text(yaml.safe_dump(data))
    proc = dstui("run", str(spec), env={"DSTUI_HOME": str(tmp_path), "MLFLOW_TRACKING_URI": uri}, timeout=900)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # one run failed on purpose
    client = mlflow_client(uri)
    exp = client.get_experiment_by_name("verify-zero")
    runs = {r.data.tags["dstui.condition"]: r for r in client.search_runs([exp.experiment_id], "tags.`dstui.role` = 'run'")}
    good, bad = runs["z3"], runs["z1-broken"]
    assert good.data.tags["dstui.verdict"] == "PASS" and good.info.status == "FINISHED"
    for key in ("grad_max_abs_diff", "param_max_abs_diff", "loss_abs_diff"):
        hist = client.get_metric_history(good.info.run_id, key)
        assert [m.step for m in sorted(hist, key=lambda m: m.step)] == [1, 2, 3]
        assert all(m.value == 0.0 for m in hist), key
    assert bad.data.tags["dstui.verdict"] == "FAIL" and bad.info.status == "FAILED"
    # the reason carries the evidence: a wrong lr leaves the applied gradient identical, the masters not
    evidence = "verify FAIL at step 1: grad-norm ratio 1.0000, identical"
    assert bad.data.tags["dstui.reason"] == evidence and bad.data.tags["dstui.evidence"] == evidence
    assert good.data.tags["dstui.evidence"] == "verify PASS: grad-norm ratio 1.0000 over 3 steps, bit-exact"
    ratios = sorted(client.get_metric_history(bad.info.run_id, "grad_norm_ratio"), key=lambda m: m.step)
    assert [m.step for m in ratios] == [1, 2, 3] and ratios[0].value == 1.0  # then the wrong update shows
    status = dstui("status", "--json", env={"DSTUI_HOME": str(tmp_path), "MLFLOW_TRACKING_URI": uri})
    runs_json = {r["condition"]: r for b in json.loads(status.stdout)["batches"] for r in b["runs"]}
    assert runs_json["z1-broken"]["reason"] == evidence and runs_json["z3"]["evidence"].startswith("verify PASS")
    table = dstui("status", env={"DSTUI_HOME": str(tmp_path), "MLFLOW_TRACKING_URI": uri, "COLUMNS": "200"}).stdout
    assert "verify PASS: grad-norm ratio 1.0000 over 3 steps, bit-exact" in table and evidence in table
