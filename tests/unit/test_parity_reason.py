"""The verify verdict's reason names the worst tensor once, and says which side when they differ."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "runners"))

from parity import divergence_reason  # noqa: E402

REC = {"loss_within_tol": 1, "grad_within_tol": 0, "param_within_tol": 0,
       "grad_max_abs_diff": 4.074e-05, "param_max_abs_diff": 1.593e-06}  # fmt: skip


def test_one_tensor_worst_on_both_sides_is_named_once() -> None:
    text = divergence_reason(REC, 0.0, 0.0, ["model.embed_tokens.weight", "model.embed_tokens.weight"])
    assert text == "grad max|d|=4.074e-05; param max|d|=1.593e-06 > rtol=0 atol=0 worst in model.embed_tokens.weight"


def test_different_worst_tensors_say_which_is_which() -> None:
    text = divergence_reason(REC, 0.0, 0.0, ["lm_head.weight", "model.norm.weight"])
    assert text.endswith("worst in lm_head.weight (grad), model.norm.weight (param)")
    only_grad = divergence_reason({**REC, "param_within_tol": 1}, 0.0, 0.0, ["lm_head.weight", ""])
    assert only_grad == "grad max|d|=4.074e-05 > rtol=0 atol=0 worst in lm_head.weight"
    assert divergence_reason(REC, 0.0, 0.0, ["", ""]).endswith("atol=0")
