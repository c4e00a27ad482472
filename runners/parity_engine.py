"""The DeepSpeed side of the parity check: data, one optimizer step, the module's state, rank agreement.

Imported by ``compare_loss.py`` after it has isolated the JIT-op cache (DeepSpeed
is imported here at module level).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import deepspeed
import torch
import torch.distributed as dist
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


@dataclass
class EngineStep:
    loss: float  # mean over this rank's micro-batches
    scale: float  # fp16 loss scale of the step (1.0 otherwise)
    skipped: bool  # fp16 overflow: DeepSpeed skipped the update
    #: full fp32 gradients from DeepSpeed's public API (only where the applied ones cannot be read)
    public_grads: dict[str, torch.Tensor] = field(default_factory=dict)


def engine_step(engine: Any, xs: list[torch.Tensor], loss_fn: Any, *, dtype: str, grad_scale: float,
                public_grads_of: list[tuple[str, Any]] | None = None) -> EngineStep:
    """One optimizer step of DeepSpeed over this rank's micro-batches.

    ``public_grads_of``: read these parameters' gradients with ``safe_get_full_grad``
    after the last backward (the fallback when parity_applied cannot locate the masters).
    """
    losses = []
    grads: dict[str, torch.Tensor] = {}
    scale = float(getattr(engine.optimizer, "loss_scale", 1.0) or 1.0) if dtype == "fp16" else 1.0
    skipped_before = engine.skipped_steps
    for m, x in enumerate(xs):
        loss = loss_fn(engine, x)
        losses.append(float(loss.detach().float()))
        engine.backward(loss * grad_scale if grad_scale != 1.0 else loss)
        if m == len(xs) - 1 and public_grads_of is not None:
            for name, p in public_grads_of:
                g = safe_get_full_grad(p)  # collective: same order on every rank
                if g is not None:
                    grads[name] = g.detach().float().clone() / scale
        engine.step()
    return EngineStep(sum(losses) / len(xs), scale, engine.skipped_steps != skipped_before, grads)


def module_params(named: list[tuple[str, Any]], stage: int, *, masters: bool) -> dict[str, torch.Tensor]:
    """Full parameters as fp32: the optimizer's masters through the public API (``masters``), else the module's."""
    out = {}
    with gathered([p for _, p in named], stage):
        for name, p in named:
            hp = safe_get_full_fp32_param(p) if masters and stage > 0 else None
            out[name] = (hp if hp is not None else p).detach().float().clone()
    return out


def rank_spread(tensors: list[torch.Tensor], device: Any, group: Any = None) -> float:
    """Collective over ``group`` (ranks holding the same tensors): their largest difference (0.0: all agree)."""
    flat = torch.cat([t.detach().reshape(-1).float().to(device) for t in tensors]) if tensors else \
        torch.zeros(1, device=device)
    hi, lo = flat.clone(), flat.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=group)
    return float((hi - lo).abs().max())
