"""The verify verdict's reason: the gradient's shape first, then every failed check with its number and tolerance."""

from __future__ import annotations

from helpers import RunnerModule

parity = RunnerModule("parity")  # torch at first use, not at every worker's collection


def test_the_shape_comes_first_then_each_failed_check_with_its_tolerance() -> None:
    ev = parity.StepEvidence(shape="grad-norm ratio 0.2500, uniform scale 0.2500 = 1/GAS (residual 6.6e-04 of |g|)",
                      l2=(0.75, 7.2e-3), tensors=(("grad", "model.embed_tokens.weight", 2.05e-2, 4.1e-3),))
    assert parity.divergence_reason(ev) == (
        "grad-norm ratio 0.2500, uniform scale 0.2500 = 1/GAS (residual 6.6e-04 of |g|); "
        "whole gradient |d-g|/|g| 7.500e-01 > 7.200e-03; grad |d| 2.050e-02 > 4.100e-03 in model.embed_tokens.weight")


def test_ranks_that_disagree_and_a_loss_out_of_tolerance_are_said() -> None:
    text = parity.divergence_reason(parity.StepEvidence(rank_spread=0.1338, loss=(1.9e-3, 6.3e-4),
                                          tensors=(("param", "lm_head.weight", 1.5e-3, 2.5e-3 / 10),)))
    assert text == ("ranks disagree by up to 1.338e-01; loss |d| 1.900e-03 > 6.300e-04; "
                    "param |d| 1.500e-03 > 2.500e-04 in lm_head.weight")


def test_an_exact_check_states_zero_tolerance() -> None:
    text = parity.divergence_reason(parity.StepEvidence(tensors=(("grad", "w", 1.863e-09, 0.0),)))
    assert text == "grad |d| 1.863e-09 > 0.000e+00 in w"
    assert parity.divergence_reason(parity.StepEvidence()) == "no difference recorded"


def test_a_wrong_pre_clip_norm_is_named_apart_from_a_wrong_gradient() -> None:
    """Clipping hides a gradient's length; the norm DeepSpeed clipped by is its own evidence."""
    alone = parity.divergence_reason(parity.StepEvidence(norm=(5.041, 2.52, 1.0004, 9.5e-7)))
    assert alone == ("pre-clip gradient norm 5.041 vs baseline 2.52 (|d|/|g| 1.000e+00 > 9.500e-07): "
                     "the gradients agree, the norm DeepSpeed clipped by does not")
    with_gradient = parity.divergence_reason(parity.StepEvidence(l2=(1.0, 9.5e-7), norm=(5.041, 2.52, 1.0004, 9.5e-7)))
    assert with_gradient.endswith("pre-clip gradient norm 5.041 vs baseline 2.52 (|d|/|g| 1.000e+00 > 9.500e-07)")
    assert "agree" not in with_gradient
