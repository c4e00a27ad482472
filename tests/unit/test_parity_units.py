"""Parity check parts that need no process group: fault specs, tolerance policy, the summary's
``worst`` list, what each runner kind refuses at spec validation, and the failure reason."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers import RunnerModule

from dstui.core import failures
from dstui.core.errors import SpecError
from dstui.spec import capabilities
from dstui.spec.expand import expand
from dstui.spec.loading import parse_spec
from dstui.spec.settings import Settings

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "runners"))

import parity_inject  # noqa: E402

parity, parity_tolerance = RunnerModule("parity"), RunnerModule("parity_tolerance")  # torch at first use

# -- fault specs -----------------------------------------------------------------------------


def test_fault_spec_parses_kind_step_and_bucket() -> None:
    assert parity_inject.parse("drop_bucket:step=3:bucket=1") == parity_inject.Fault("drop_bucket", 3, 1)
    assert parity_inject.parse("skip_gas_scaling") == parity_inject.Fault("skip_gas_scaling", 2, 0)


@pytest.mark.parametrize("text", ["drop", "drop_bucket:step=x", "double_grad:when=2", "double_grad:step=0"])
def test_bad_fault_spec_names_the_variable(text: str) -> None:
    with pytest.raises(ValueError, match="DSTUI_PARITY_INJECT"):
        parity_inject.parse(text)


# -- tolerance policy ------------------------------------------------------------------------


def test_exact_only_where_the_arithmetic_is_the_same() -> None:
    same = {"dtype": "fp32", "world": 2, "clip": 0.0, "client_optimizer": True, "stage": 2,
            "mirror_zero3_hooks": False}
    assert parity_tolerance.exact_is_possible(**same) == (True, "")
    for change, word in [({"dtype": "bf16"}, "bf16"), ({"world": 3}, "3-rank"), ({"clip": 1.0}, "clipping"),
                         ({"client_optimizer": False}, "optimizer"), ({"stage": 3}, "ZeRO-3")]:
        ok, why = parity_tolerance.exact_is_possible(**{**same, **change})
        assert not ok and word in why
    assert parity_tolerance.exact_is_possible(**{**same, "stage": 3, "mirror_zero3_hooks": True})[0]


def test_policy_modes_and_basis() -> None:
    assert parity_tolerance.choose("auto", rtol=0, atol=0, can_be_exact=True, why="").mode == "exact"
    measured = parity_tolerance.choose("auto", rtol=0, atol=0, can_be_exact=False, why="bf16 rounding")
    assert measured.mode == "measured" and "bf16 rounding" in measured.basis()
    given = parity_tolerance.choose("auto", rtol=1e-5, atol=1e-8, can_be_exact=True, why="")
    assert given.mode == "given" and given.tolerance() == 1e-8 and given.rtol_for() == 1e-5


def test_measured_tolerance_scales_the_twin_noise_to_each_tensor() -> None:
    import torch

    pol = parity_tolerance.choose("measured", rtol=0, atol=0, can_be_exact=True, why="")
    base = torch.tensor([1.0, -2.0])
    pol.noise.observe("grad", [(base + torch.tensor([0.0, 2e-3]), base)])  # 1e-3 of the scale 2
    assert pol.noise.rel["grad"] == pytest.approx(1e-3, rel=1e-4)
    assert pol.atol_for("grad", torch.tensor([0.0, 4.0])) == pytest.approx(parity_tolerance.SAFETY * 1e-3 * 4, rel=1e-4)
    # no noise seen: the floor, a few fp32 ulps of the tensor's scale, never zero
    assert pol.atol_for("param", base) == pytest.approx(parity_tolerance.FLOOR_REL * 2)
    assert pol.tolerance() == pytest.approx(parity_tolerance.SAFETY * 1e-3 * 4, rel=1e-4)


def test_a_half_precision_loss_is_held_to_1e_4_of_itself_at_least_and_nothing_else_is() -> None:
    """ZeRO-1 bf16 failed on a loss 4.7e-6 (relative) from the baseline: its twin had moved 1.5e-7."""
    import torch

    loss = torch.tensor(6.25)
    for dtype, floor in (("bf16", 1e-4), ("fp16", 1e-4), ("fp32", parity_tolerance.FLOOR_REL)):
        pol = parity_tolerance.choose("auto", rtol=0, atol=0, can_be_exact=False, why="x", dtype=dtype)
        pol.noise.observe("loss", [(loss * (1 + 1.5e-7), loss)])
        seen = pol.noise.rel["loss"]  # 1.5e-7 as float32 rounds it
        assert pol.atol_for("loss", loss) == pytest.approx(max(parity_tolerance.SAFETY * seen, floor) * 6.25, rel=1e-6)
        assert pol.atol_for("grad", torch.tensor([2.0])) == pytest.approx(parity_tolerance.FLOOR_REL * 2)  # only the loss
        assert ("of the loss: half precision" in pol.basis()) == (dtype != "fp32")
    bf16 = parity_tolerance.choose("auto", rtol=0, atol=0, can_be_exact=False, why="x", dtype="bf16")
    assert 6.25 * 4.7e-6 < bf16.atol_for("loss", loss) < 6.25 * 2**-8  # the seen wander passes; one bf16 ulp does not


def test_worst_lists_the_largest_differences_with_their_kind() -> None:
    import torch

    a = torch.zeros(3)
    g = parity.compare_named([("w", a + 1e-3, a), ("v", a, a), ("u", a + 1e-1, a)], rtol=0, atol=1e-2)
    p = parity.compare_named([("w", a + 1e-2, a)], rtol=0, atol=0)
    every = parity.worst_tensors({"grad": g, "param": p}, 2)
    assert [(r["name"], r["kind"]) for r in every] == [("u", "grad"), ("w", "param")]
    bad = parity.worst_tensors({"grad": g, "param": p}, 5, offenders_only=True)
    assert {(r["name"], r["kind"]) for r in bad} == {("u", "grad"), ("w", "param")}


# -- refuse early: what a runner kind cannot do ----------------------------------------------


def _expand(settings: dict, **condition: object) -> None:
    spec = parse_spec({"name": "t", "settings": {"steps": 3, "warmup_steps": 0, **settings},
                       "conditions": [{"name": "c", **condition}]}, file="t.yaml")
    expand(spec, file="t.yaml")


@pytest.mark.parametrize(
    ("settings", "condition", "field"),
    [({"kind": "verify"}, {"sequence_parallel": 2}, "sequence_parallel"),
     ({"kind": "verify"}, {"activation_checkpointing": True}, "activation_checkpointing"),
     ({"kind": "verify"}, {"dataset": "tiny-corpus"}, "dataset"),
     ({"kind": "verify"}, {"ds_overrides": {"optimizer": {"type": "Lamb"}}}, "ds_overrides.optimizer"),
     ({"kind": "train"}, {"mirror_zero3_hooks": True}, "mirror_zero3_hooks")],
)
def test_a_setting_the_runner_cannot_do_is_refused_in_one_line(settings: dict, condition: dict, field: str) -> None:
    with pytest.raises(SpecError) as e:
        _expand(settings, **condition)
    text = str(e.value)
    assert "\n" not in text and e.value.field == field and e.value.condition == "c"
    assert text.startswith("t.yaml: condition 'c'") and "cannot do" in text


def test_the_recipes_where_bugs_live_are_accepted() -> None:
    _expand({"kind": "verify", "grad_accum": 4, "dtype": "bf16"}, zero_stage=3,
            ds_overrides={"zero_optimization": {"overlap_comm": True, "reduce_bucket_size": 20000},
                          "gradient_clipping": 1.0, "optimizer": {"type": "AdamW"}})
    assert capabilities.refusal(Settings(kind="train", grad_accum=4)) is None


def test_where_bugs_live_spec_validates() -> None:
    from dstui.spec.loading import expand_file

    spec, runs = expand_file(REPO / "configs" / "experiments" / "where_bugs_live.yaml")
    assert len(spec.revisions) == 2 and {r.settings.kind for r in runs} == {"verify"}
    assert any(r.settings.grad_accum > 1 for r in runs)


# -- explain always: the runner's own last error line is the reason -------------------------


def test_reason_is_the_runners_own_error_line() -> None:
    tail = ("compare_loss ZeRO-2 banner\ncompare_loss.py: error: DSTUI_PARITY_INJECT: unknown fault 'x'\n"
            "[ERROR] [launch.py:259:sigkill_handler] ... exits with return code = 2\n")
    assert failures.classify(tail, 2) == "compare_loss.py: error: DSTUI_PARITY_INJECT: unknown fault 'x'"
    assert failures.classify("[rank 1] train.py: error: no such dataset\n", 1) == "train.py: error: no such dataset"
    assert failures.classify("nothing useful\n", 1) == "exit code 1"
