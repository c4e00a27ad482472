"""The DeepSpeed side of the parity check: data, one optimizer step, the full fp32 state.

Imported by ``compare_loss.py`` after it has isolated the JIT-op cache (DeepSpeed
is imported here at module level).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

import deepspeed
import torch
from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_grad
from parity import rank_slice, synthetic_batch


@contextlib.contextmanager
def gathered(params: list[Any], stage: int) -> Iterator[None]:
    """Full parameters on every rank: GatheredParameters under ZeRO-3, a no-op below."""
    if stage == 3:
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            yield
    else:
        yield


def micro_batches(args: argparse.Namespace, step: int, *, rank: int, world: int, micro: int,
                  gas: int, vocab: int, device: Any) -> list[torch.Tensor]:
    """This rank's micro-batches of one optimizer step (micro-step-major, then rank)."""
    batch = synthetic_batch(args.seed, step, global_batch=micro * world * gas,
                            seq_length=args.seq_length, vocab_size=vocab)
    return [rank_slice(batch[m * micro * world:(m + 1) * micro * world], rank, micro).to(device)
            for m in range(gas)]


def engine_step(engine: Any, xs: list[torch.Tensor], named: list[tuple[str, Any]], *, stage: int,
                dtype: str, grad_scale: float) -> tuple[float, dict[str, torch.Tensor], float, bool]:
    """One optimizer step of DeepSpeed: (mean loss, full fp32 grads, loss scale, skipped)."""
    losses = []
    grads: dict[str, torch.Tensor] = {}
    scale = float(getattr(engine.optimizer, "loss_scale", 1.0) or 1.0) if dtype == "fp16" else 1.0
    skipped_before = engine.skipped_steps
    for m, x in enumerate(xs):
        loss = engine(input_ids=x, labels=x).loss
        losses.append(float(loss.detach().float()))
        engine.backward(loss * grad_scale if grad_scale != 1.0 else loss)
        if m == len(xs) - 1:
            for name, p in named:
                g = safe_get_full_grad(p)  # collective: same order on every rank
                if g is not None:
                    grads[name] = g.detach().float().clone() / scale
        engine.step()
    return sum(losses) / len(xs), grads, scale, engine.skipped_steps != skipped_before


def engine_params(named: list[tuple[str, Any]], stage: int) -> dict[str, torch.Tensor]:
    """The fp32 parameters DeepSpeed's optimizer holds (its masters), else the module's."""
    out = {}
    with gathered([p for _, p in named], stage):
        for name, p in named:
            hp = safe_get_full_fp32_param(p) if stage > 0 else None
            out[name] = (hp if hp is not None else p).detach().float().clone()
    return out
