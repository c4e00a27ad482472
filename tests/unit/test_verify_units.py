"""Issue 37's pieces that need no process group: the gradient's shape, the verdict's evidence line,
the injected reductions, and which pipeline requests a spec may make."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "runners"))

from dstui.core import verdicts  # noqa: E402
from dstui.spec import capabilities  # noqa: E402
from dstui.spec.settings import Settings  # noqa: E402


def _shape(d: dict, g: dict, *, local: dict | None = None, micro: list | None = None, gas: int = 4,
           world: int = 2, tol: float = 1e-2) -> object:
    import parity_shape

    pieces = [(n, 0, t.reshape(-1)) for n, t in d.items()]
    t = parity_shape.terms(pieces, g, local or {}, micro or [])
    return parity_shape.classify(t.tolist(), gas=gas, world=world, tol=tol, has_local=local is not None)


def _grads(seed: int) -> dict:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(5, 7, generator=gen), "b": torch.randn(11, generator=gen)}


def test_identical_and_rounding_level_gradients() -> None:
    g = _grads(0)
    s = _shape(g, g)
    assert s.kind == "rounding-level" and s.text == "grad-norm ratio 1.0000, identical"
    s = _shape({n: t * (1 + 1e-4) for n, t in g.items()}, g)
    assert s.kind == "rounding-level" and "rounding-level (|d|/|g| 1.0e-04 <= 1.0e-02)" in s.text


@pytest.mark.parametrize(("scale", "name"), [(0.25, "1/GAS"), (1 / 16, "1/GAS²"), (0.5, "(W-1)/W"), (4.0, "GAS"),
                                             (0.37, "")])
def test_a_uniform_scale_is_named_when_a_reduction_bug_makes_it(scale: float, name: str) -> None:
    g = _grads(1)
    s = _shape({n: t * scale for n, t in g.items()}, g)
    assert s.kind == "uniform" and math.isclose(s.ratio, scale, rel_tol=1e-6)
    assert (f"uniform scale {scale:.4f} = {name}" in s.text) if name else s.text.endswith("of |g|)")
    assert s.text.startswith(f"grad-norm ratio {scale:.4f}, uniform scale")


def test_rank_local_and_a_dropped_micro_batch_are_told_apart() -> None:
    shares = [_grads(10 + k) for k in range(4)]
    g = {n: sum(s[n] for s in shares) for n in shares[0]}
    local = {n: t * 1.3 + 0.2 for n, t in g.items()}
    s = _shape(local, g, local=local, micro=shares)
    assert s.kind == "rank-local" and "rank-local: each rank applied its own gradient" in s.text
    dropped = {n: g[n] - shares[2][n] for n in g}
    s = _shape(dropped, g, local=local, micro=shares)
    assert s.kind == "micro-batch" and "micro-batch 3 of 4 dropped from the sum" in s.text
    s = _shape({n: t + _grads(99)[n] for n, t in g.items()}, g, local=local, micro=shares)
    assert s.kind == "no simple shape" and "cos" in s.text


def test_no_baseline_gradient_is_said_not_divided_by() -> None:
    import parity_shape

    s = parity_shape.classify([0.0, 0.0, 0.0, 0.0], gas=1, world=2, tol=0.0, has_local=True)
    assert s.kind == "no gradient" and math.isnan(s.ratio)


def test_the_evidence_line_of_a_fail_and_of_a_pass() -> None:
    fail = {"verdict": "FAIL", "first_diverging_step": 1, "grad_shape": "grad-norm ratio 0.2500, uniform scale 0.2500"}
    assert verdicts.evidence(fail) == "verify FAIL at step 1: grad-norm ratio 0.2500, uniform scale 0.2500"
    assert verdicts.evidence({"verdict": "FAIL", "first_diverging_step": 3}) == "verify FAIL (first diverging step 3)"
    ok = {"verdict": "PASS", "grad_norm_ratios": [0.99991, 1.0001, None], "margin_max": 0.237}
    assert verdicts.evidence(ok) == ("verify PASS: grad-norm ratio 0.9999..1.0001 over 2 steps, "
                                     "largest difference 0.24x its tolerance")
    assert verdicts.evidence({"verdict": "PASS", "grad_norm_ratios": [1.0], "margin_max": 0}) == \
        "verify PASS: grad-norm ratio 1.0000 over 1 steps, bit-exact"
    assert verdicts.evidence({"verdict": "FAIL", "check": "sp-check"}) is None  # another check's verdict
    assert verdicts.evidence({"status": "ok"}) is None


@given(st.dictionaries(st.sampled_from(["verdict", "grad_shape", "first_diverging_step", "grad_norm_ratios",
                                        "margin_max", "check"]),
                       st.one_of(st.text(max_size=3000), st.floats(allow_nan=True), st.integers(),
                                 st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.text()),
                                          max_size=50), st.none(), st.sampled_from(["PASS", "FAIL"]))))
def test_the_evidence_of_any_summary_is_one_bounded_printable_line(summary: dict) -> None:
    text = verdicts.evidence(summary)
    assert text is None or (len(text) <= 300 and text.isprintable())


def test_a_rank_local_reduction_returns_this_ranks_share_as_if_every_rank_sent_it() -> None:
    import parity_faults
    import torch
    import torch.distributed as dist

    t = torch.tensor([1.0, 2.0])
    parity_faults._local("all_reduce", 2, 1)(t, dist.ReduceOp.SUM)
    assert t.tolist() == [2.0, 4.0]
    flags = torch.tensor([1], dtype=torch.uint8)
    parity_faults._local("all_reduce", 2, 1)(flags, op=dist.ReduceOp.MAX)  # an overflow flag stays as it is
    assert flags.tolist() == [1]
    out = torch.zeros(2)
    parity_faults._local("reduce_scatter_tensor", 2, 1)(out, torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert out.tolist() == [6.0, 8.0]


def test_fault_options_parse_and_bad_ones_say_what_to_use() -> None:
    import parity_inject

    assert parity_inject.parse("drop_micro:step=1:micro=3") == parity_inject.Fault("drop_micro", step=1, micro=3)
    assert parity_inject.parse("stage_scale:stage=0").stage == 0
    with pytest.raises(ValueError, match="use step=N, bucket=K, micro=M, stage=S"):
        parity_inject.parse("rank_local:rank=1")
    with pytest.raises(ValueError, match="must be >= 1"):
        parity_inject.parse("drop_micro:micro=0")


@pytest.mark.parametrize(
    ("settings", "refused"),
    [({"kind": "train", "ds_overrides": {"pipeline": {"stages": 2}}}, "runners/train.py builds no pipeline engine"),
     ({"kind": "train", "pipeline_stages": 2}, "it is a setting of kind: verify"),
     ({"kind": "verify", "ds_overrides": {"pipeline": {}}, "gpus": 2}, "set pipeline_stages: N"),
     ({"kind": "verify", "pipeline_stages": 2, "gpus": 3}, "multiple of pipeline_stages"),
     ({"kind": "verify", "pipeline_stages": 2, "gpus": 2, "zero_stage": 2}, "ZeRO stage 0 and 1 only"),
     ({"kind": "verify", "pipeline_stages": 2, "gpus": 2, "loss_pattern": "frozen"}, "standard loss only"),
     ({"kind": "verify", "pipeline_stages": 2, "gpus": 2, "zero_stage": 1}, None),
     ({"kind": "verify", "loss_pattern": "outside_branch", "zero_stage": 3}, None)],
)
def test_what_a_spec_may_ask_of_pipelines(settings: dict, refused: str | None) -> None:
    why = capabilities.refusal(Settings(**settings))
    if refused is None:
        assert why is None
    else:
        assert why is not None and refused in why.message


def test_a_train_spec_with_a_pipeline_block_is_refused_in_one_line(tmp_path: Path) -> None:
    """Before issue 37 it was accepted, trained data-parallel and ended done without a word."""
    from helpers import dstui

    spec = tmp_path / "pp.yaml"
    spec.write_text("name: pp\nsettings: {model: tiny-llama, gpus: 2, steps: 2, warmup_steps: 0,\n"
                    "  ds_overrides: {pipeline: {stages: 2}}}\n")
    proc = dstui("list", str(spec), env={"DSTUI_HOME": str(tmp_path)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert "ds_overrides.pipeline" in line and "builds no pipeline engine" in line and "pipeline_stages" in line
