"""How a training step turns a micro-batch into the loss: patterns that real DeepSpeed bugs needed.

Users found several of DeepSpeed's gradient bugs only because their loss was
not "one forward, ``.loss``, backward" (issue 37). A verify spec chooses one
with ``loss_pattern``; both sides of the parity check compute the same loss
from the same micro-batch, DeepSpeed's through its engine and the baseline's
through its plain module:

* ``standard``: ``model(input_ids=x, labels=x).loss``.
* ``second_forward``: two forwards per backward (the batch and the batch
  reversed), their losses averaged: ZeRO-3 gathers and releases parameters
  twice before one backward.
* ``logits_in_loss``: the HF loss plus a z-loss on the logits of the same
  output (PaLM's ``1e-4 * logsumexp(logits)^2``), so a backward flows through
  an output that carries both the loss and the logits; a 1/GAS applied to
  every tensor output of the engine's forward scales that term twice.
* ``outside_branch``: the HF loss plus a term that the wrapped module
  computes *outside* the engine's forward (input embeddings -> output
  projection, called on ``engine.module``); hooks placed on the engine's
  forward never see it.
* ``frozen``: the input embeddings do not train (``requires_grad=False``
  before DeepSpeed sees the model): the optimizer holds the other parameters
  only, and the frozen ones must stay as they were.

Reused submodules are a model, not a pattern: ``model: tiny-llama-shared``
(tied embeddings and one decoder layer applied twice per step).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Z_LOSS = 1e-4
BRANCH_WEIGHT = 1e-3


def bare_module(model: Any) -> Any:
    """The module a forward runs in: an engine's ``module``, a compiled model's ``_orig_mod``."""
    for attr in ("module", "_orig_mod"):
        inner = getattr(model, attr, None)
        if isinstance(inner, torch.nn.Module):
            return inner
    return model


def _z_loss(logits: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(logits.float(), dim=-1).pow(2).mean()


def _standard(model: Any, x: torch.Tensor) -> torch.Tensor:
    return model(input_ids=x, labels=x).loss


def _second_forward(model: Any, x: torch.Tensor) -> torch.Tensor:
    y = x.flip(1)
    return 0.5 * (model(input_ids=x, labels=x).loss + model(input_ids=y, labels=y).loss)


def _logits_in_loss(model: Any, x: torch.Tensor) -> torch.Tensor:
    out = model(input_ids=x, labels=x)
    return out.loss + Z_LOSS * _z_loss(out.logits)


def _outside_branch(model: Any, x: torch.Tensor) -> torch.Tensor:
    module = bare_module(model)
    branch = module.get_output_embeddings()(module.get_input_embeddings()(x))
    return model(input_ids=x, labels=x).loss + BRANCH_WEIGHT * _z_loss(branch)


LOSSES: dict[str, Callable[[Any, torch.Tensor], torch.Tensor]] = {
    "standard": _standard, "second_forward": _second_forward, "logits_in_loss": _logits_in_loss,
    "outside_branch": _outside_branch, "frozen": _standard,
}


def loss_fn(pattern: str) -> Callable[[Any, torch.Tensor], torch.Tensor]:
    return LOSSES[pattern]


def prepare(model: torch.nn.Module, pattern: str) -> None:
    """What a pattern changes in the model itself, before either side copies it."""
    if pattern == "frozen":
        model.get_input_embeddings().weight.requires_grad_(False)
