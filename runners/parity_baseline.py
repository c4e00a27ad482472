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
* **bf16/fp16 with fp32 master weights**: the module's parameters (not its buffers) live in the
  low-precision dtype (forward and backward run there, like the engine's
  module), an fp32 master copy is what the optimizer updates, and the masters
  are cast back into the module after each step. fp16 uses the loss scale that
  DeepSpeed used at that step, and skips the step when DeepSpeed did.
* **gradient clipping**: by the global L2 norm of the averaged fp32 gradients.

A *twin* (``coarse=True``) is the same baseline with every rounding choice
turned the other legitimate way: the opposite reduction order, the sum over
ranks in reverse rank order, accumulation and communication in the model's
dtype, and the clipping norm in float64. The distance between the baseline and
its twin is the arithmetic noise of the recipe, which sets the tolerance when
the check cannot be bit-exact (see parity_tolerance.py).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from parity import TORCH_DTYPES


def make_torch_opt(params: Any, kind: str, kwargs: dict[str, Any]) -> torch.optim.Optimizer:
    return getattr(torch.optim, kind)(params, **kwargs)


class Baseline:
    """One data-parallel replica of the model trained without DeepSpeed."""

    def __init__(self, model: torch.nn.Module, *, dtype: str, opt_kind: str, opt_kwargs: dict[str, Any],
                 clip: float, reduce: str, coarse: bool = False) -> None:
        self.model = model
        self.low = TORCH_DTYPES[dtype] if dtype != "fp32" else None
        self.coarse = coarse
        self.reduce = reduce if not coarse else ("micro" if reduce == "boundary" else "boundary")
        self.clip = clip
        self.world = dist.get_world_size()
        self.named = [(n.removeprefix("_orig_mod."), p) for n, p in model.named_parameters()]
        if self.low is not None:
            # Parameters only, as DeepSpeed casts them: buffers (rotary inv_freq) stay fp32.
            for _, p in self.named:
                p.data = p.data.to(self.low)
            self.masters = [p.detach().float().clone().requires_grad_(True) for _, p in self.named]
        else:
            self.masters = [p for _, p in self.named]
        self.opt = make_torch_opt(self.masters, opt_kind, opt_kwargs)

    # -- reduction ------------------------------------------------------------

    def _comm_dtype(self) -> torch.dtype:
        return self.low if (self.coarse and self.low is not None) else torch.float32

    def _all_reduce_mean(self, g: torch.Tensor) -> torch.Tensor:
        """Mean over ranks; the twin sums an all-gather in reverse rank order."""
        t = g.to(self._comm_dtype())
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

    def step(self, micro_batches: list[torch.Tensor], *, loss_scale: float = 1.0,
             skip: bool = False) -> tuple[float, dict[str, torch.Tensor], float]:
        """Train on this rank's micro-batches; (mean loss, averaged fp32 grads, grad norm)."""
        gas = len(micro_batches)
        acc: dict[str, torch.Tensor] = {}
        acc_dtype = self.low if (self.coarse and self.low is not None) else torch.float32
        losses = []
        for x in micro_batches:
            for _, p in self.named:
                p.grad = None
            loss = self.model(input_ids=x, labels=x).loss
            losses.append(float(loss.detach().float()))
            ((loss / gas) * loss_scale if loss_scale != 1.0 else loss / gas).backward()
            for name, p in self.named:
                if p.grad is None:
                    continue
                g = p.grad.detach()
                if self.reduce == "micro":
                    g = self._all_reduce_mean(g)
                g = g.to(acc_dtype)
                if name in acc:
                    acc[name].add_(g)
                else:
                    acc[name] = g.clone()
        if self.reduce == "boundary":
            acc = {n: self._all_reduce_mean(g) for n, g in acc.items()}
        grads = {n: g.float() / loss_scale if loss_scale != 1.0 else g.float() for n, g in acc.items()}
        norm = self._norm(grads)
        if not skip:
            self._update(grads, norm)
        for _, p in self.named:
            p.grad = None
        return sum(losses) / gas, grads, norm

    def _norm(self, grads: dict[str, torch.Tensor]) -> float:
        if self.coarse:
            return math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads.values()))
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()])))

    def _update(self, grads: dict[str, torch.Tensor], norm: float) -> None:
        coef = 1.0
        if self.clip > 0 and norm > self.clip:
            coef = self.clip / (norm + 1e-6)
        for (name, _), master in zip(self.named, self.masters, strict=True):
            g = grads.get(name)
            master.grad = None if g is None else (g * coef if coef != 1.0 else g.clone())
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.low is not None:
            with torch.no_grad():
                for (_, p), master in zip(self.named, self.masters, strict=True):
                    p.copy_(master.to(self.low))

    def params(self) -> dict[str, torch.Tensor]:
        """The fp32 parameters the optimizer holds (masters under bf16/fp16)."""
        return {name: m.detach().float() for (name, _), m in zip(self.named, self.masters, strict=True)}


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
