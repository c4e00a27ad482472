"""The plain-PyTorch side of the parity check: data parallelism written out by hand.

:class:`Baseline` trains a copy of the initial model the way DeepSpeed's
recipes do, with nothing hidden:

* **gradient accumulation**: each micro-batch's loss is divided by the
  accumulation steps before backward (as ``engine.backward`` does), and the
  micro-step gradients are either summed locally and reduced once at the
  boundary (``reduce="boundary"``: ZeRO-0/1, which reduce only there) or
  reduced every micro-step and the reduced values summed
  (``reduce="micro"``: ZeRO-2/3, which reduce-scatter in the backward hooks).
  The two orders are the same mathematics with different rounding; choosing
  DeepSpeed's order is what makes fp32 bit-exact.
* **bf16/fp16 with fp32 master weights**: the module's parameters and buffers
  take the dtypes the engine's module holds after ``deepspeed.initialize`` (read
  from it, not assumed: releases differ in whether buffers are cast), forward
  and backward run there, an fp32 master copy is what the optimizer updates,
  and the masters are cast back into the module after each step. fp16 uses the
  loss scale that DeepSpeed used at that step, and skips the step when
  DeepSpeed did.
* **gradient clipping**: by the global L2 norm of the averaged fp32 gradients.
  :meth:`Baseline.step` returns the gradient *before* clipping (reduced,
  unscaled) with the coefficient it clipped by: clipping rescales a wrong
  gradient back to the right length (a ZeRO-2 bucket doubled on every step
  applied the same update as the baseline under ``gradient_clipping: 1``), so
  the comparison is made before it; :meth:`BaseStep.after_clipping` gives
  the applied one where DeepSpeed's side can only be read after.

A *twin* (``coarse=True``) is the same baseline with every rounding choice
turned the other legitimate way: the opposite reduction order, the sum over
ranks in reverse rank order, accumulation and communication in the model's
dtype, and the clipping norm in float64. The distance between the baseline and
its twin is the arithmetic noise of the recipe, which sets the tolerance when
the check cannot be bit-exact (see parity_tolerance.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

#: (model, this micro-batch's token ids) -> the loss to backpropagate (parity_patterns.py)
LossFn = Callable[[Any, torch.Tensor], torch.Tensor]


def make_torch_opt(params: Any, kind: str, kwargs: dict[str, Any]) -> torch.optim.Optimizer:
    return getattr(torch.optim, kind)(params, **kwargs)


@dataclass
class BaseStep:
    """One optimizer step of a baseline, in the terms DeepSpeed's optimizer applies."""

    loss: float  # mean over this rank's micro-batches
    grads: dict[str, torch.Tensor]  # reduced, averaged and unscaled fp32, before clipping
    norm: float  # global norm before clipping (what DeepSpeed reports)
    coef: float = 1.0  # the clipping coefficient: the optimizer applied ``grads`` times this
    #: this rank's own gradient, never reduced (same scaling): what a rank-local bug applies
    local: dict[str, torch.Tensor] = field(default_factory=dict)
    #: each micro-step's reduced share of ``grads`` (explaining baselines with grad_accum > 1)
    micro: list[dict[str, torch.Tensor]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # each micro-batch's loss (fp32 values)

    def after_clipping(self) -> BaseStep:
        """The same step in the terms of the gradient the optimizer applied (clipped)."""
        if self.coef == 1.0:
            return self
        c = self.coef
        return BaseStep(self.loss, {n: g * c for n, g in self.grads.items()}, self.norm, 1.0,
                        local={n: g * c for n, g in self.local.items()},
                        micro=[{n: g * c for n, g in m.items()} for m in self.micro], losses=self.losses)


class Baseline:
    """One data-parallel replica of the model trained without DeepSpeed.

    ``param_dtype`` and ``buffer_dtypes`` are read from the engine under test
    (what its module holds after ``deepspeed.initialize``), not assumed: older
    releases cast buffers (rotary ``inv_freq``) to bf16 as well, and a baseline
    that keeps them fp32 computes another function. ``explain``: also keep the
    rank-local gradient and each micro-step's share, for the shape of a
    gradient error (parity_shape.py).
    """

    def __init__(self, model: torch.nn.Module, *, param_dtype: torch.dtype, opt_kind: str,
                 opt_kwargs: dict[str, Any], clip: float, reduce: str, coarse: bool = False,
                 buffer_dtypes: dict[str, torch.dtype] | None = None, explain: bool = False) -> None:
        self.model = model
        self.low = param_dtype if param_dtype != torch.float32 else None
        self.coarse = coarse
        self.explain = explain
        self.reduce = reduce if not coarse else ("micro" if reduce == "boundary" else "boundary")
        self.clip = clip
        self.world = dist.get_world_size()
        self.named = [(n.removeprefix("_orig_mod."), p) for n, p in model.named_parameters()]
        self.trainable = {n for n, p in self.named if p.requires_grad}
        if self.low is not None:
            for _, p in self.named:
                p.data = p.data.to(self.low)
            self.masters = [p.detach().float().clone().requires_grad_(p.requires_grad) for _, p in self.named]
        else:
            self.masters = [p for _, p in self.named]
        for name, buf in model.named_buffers():
            want = (buffer_dtypes or {}).get(name.removeprefix("_orig_mod."))
            if want is not None and buf.dtype != want:
                buf.data = buf.data.to(want)
        self.opt = make_torch_opt([m for m in self.masters if m.requires_grad], opt_kind, opt_kwargs)

    def warm_start(self, steps: int) -> None:
        """Take ``steps`` optimizer steps on zero gradients, as DeepSpeed's wrapper did at start-up.

        FP16_Optimizer / FP16_UnfusedOptimizer initialize the optimizer's state with
        one ``step()`` on zero gradients: the masters stay (without weight decay), but
        Adam's step count starts at 1, so its bias correction makes the first real update
        0.744 lr instead of lr (measured, ZeRO-0 bf16, DeepSpeed 0.19.8). The count is
        read from the engine's optimizer state (parity_applied.optimizer_steps).
        """
        for _ in range(steps):
            for m in self.masters:
                if m.requires_grad:
                    m.grad = torch.zeros_like(m)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        if steps and self.low is not None:
            with torch.no_grad():
                for (_, p), master in zip(self.named, self.masters, strict=True):
                    p.copy_(master.to(self.low))

    # -- reduction ------------------------------------------------------------

    def _comm_dtype(self) -> torch.dtype:
        return self.low if (self.coarse and self.low is not None) else torch.float32

    def _all_reduce_mean(self, g: torch.Tensor) -> torch.Tensor:
        """Mean over ranks; the twin sums an all-gather in reverse rank order."""
        t = g.to(self._comm_dtype(), copy=True)  # never reduce the caller's tensor in place
        if self.coarse and self.world > 2:
            parts = [torch.empty_like(t) for _ in range(self.world)]
            dist.all_gather(parts, t)
            t = parts[-1].clone()
            for part in reversed(parts[:-1]):
                t.add_(part)
        else:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.float().div_(self.world)

    # -- one optimizer step ---------------------------------------------------

    def _micro_grads(self, x: torch.Tensor, loss_fn: LossFn, gas: int, loss_scale: float
                     ) -> tuple[float, dict[str, torch.Tensor]]:
        for _, p in self.named:
            p.grad = None
        loss = loss_fn(self.model, x)
        ((loss / gas) * loss_scale if loss_scale != 1.0 else loss / gas).backward()
        return float(loss.detach().float()), {n: p.grad.detach() for n, p in self.named if p.grad is not None}

    def step(self, micro_batches: list[torch.Tensor], loss_fn: LossFn, *, loss_scale: float = 1.0,
             skip: bool = False) -> BaseStep:
        """Train on this rank's micro-batches, as DeepSpeed's recipe does (see the module docstring)."""
        gas = len(micro_batches)
        acc: dict[str, torch.Tensor] = {}
        local: dict[str, torch.Tensor] = {}
        micro: list[dict[str, torch.Tensor]] = []
        acc_dtype = self.low if (self.coarse and self.low is not None) else torch.float32
        losses = []
        for x in micro_batches:
            loss, grads = self._micro_grads(x, loss_fn, gas, loss_scale)
            losses.append(loss)
            share = {}
            for name, g in grads.items():
                if self.explain:
                    local[name] = local[name] + g.float() if name in local else g.float().clone()
                if self.reduce == "micro" or (self.explain and gas > 1):
                    share[name] = self._all_reduce_mean(g)
                g = (share[name] if self.reduce == "micro" else g).to(acc_dtype)
                acc[name] = acc[name].add_(g) if name in acc else g.clone()
            if self.explain and gas > 1:
                micro.append(share)
        if self.reduce == "boundary":
            acc = {n: self._all_reduce_mean(g) for n, g in acc.items()}
        unscale = 1.0 / loss_scale
        grads = {n: g.float() * unscale for n, g in acc.items()}
        norm = self._norm(grads)
        coef = self.clip / (norm + 1e-6) if self.clip > 0 and norm > self.clip else 1.0
        applied = {n: g * coef for n, g in grads.items()} if coef != 1.0 else grads
        if not skip:
            self._update(applied)
        for _, p in self.named:
            p.grad = None
        return BaseStep(sum(losses) / gas, grads, norm, coef,
                        local={n: g * unscale for n, g in local.items()},
                        micro=[{n: g * unscale for n, g in m.items()} for m in micro], losses=losses)

    def _norm(self, grads: dict[str, torch.Tensor]) -> float:
        if not grads:
            return 0.0
        if self.coarse:
            return math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads.values()))
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()])))

    def _update(self, grads: dict[str, torch.Tensor]) -> None:
        for (name, _), master in zip(self.named, self.masters, strict=True):
            g = grads.get(name)
            master.grad = None if g is None else g.clone()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.low is not None:
            with torch.no_grad():
                for (_, p), master in zip(self.named, self.masters, strict=True):
                    p.copy_(master.to(self.low))

    def params(self) -> dict[str, torch.Tensor]:
        """What the optimizer holds (fp32 masters under bf16/fp16); a frozen parameter as the module holds it."""
        return {name: (m if name in self.trainable else p).detach().float()
                for (name, p), m in zip(self.named, self.masters, strict=True)}


class _Identity(torch.autograd.Function):
    """What ZeRO-3 puts around module inputs and outputs: x.detach() forward, grad as is."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def mirror_zero3_hooks(model: torch.nn.Module) -> None:
    """Give the baseline the autograd graph that ZeRO-3 gives the engine's model.

    ZeRO-3 (deepspeed/runtime/zero/parameter_offload.py) wraps the tensor inputs
    (forward pre-hook, ``PostBackwardFunctionModule``) and outputs (forward
    hook, ``PreBackwardFunctionForModule``) of *every* module in identity
    autograd Functions so it learns when a module's backward starts and ends.
    They do not change values, but they change how autograd groups the sum of
    gradients of a tensor used three or more times: the residual stream feeds
    the residual add and an RMSNorm that uses its input twice, and
    ``r + (p + m)`` is not ``(r + m) + p`` in floating point. With this the
    baseline sums in the same grouping, so what remains to compare is ZeRO-3's
    partitioning and communication. Uses DeepSpeed's own traversal of nested
    outputs so that the same tensors get wrapped.
    """
    from deepspeed.runtime.zero.utils import apply_to_tensors_only

    def wrap(obj: Any) -> Any:
        return apply_to_tensors_only(_Identity.apply, obj)

    for module in model.modules():
        module.register_forward_pre_hook(lambda _m, inputs: wrap(inputs))
        module.register_forward_hook(lambda _m, _inputs, output: wrap(output))
