"""What DeepSpeed's optimizer applies: the gradient it steps with and the fp32 master weights it holds.

Comparing anything else compares unlike things. In bf16 the module's own
gradient (``param.grad``, or ``safe_get_full_grad`` on releases before 0.19.8)
is the *rank-local* bf16 sum before the all-reduce, and the module's weights
are bf16 roundings of the masters; both differ from the baseline's by far more
than the arithmetic noise, on correct releases (issue 37 measured a max|d| of
4.1e-2 on every release before 0.19.8, bug or not, and ZeRO-0 layernorm
weights off by exactly the learning rate).

So the runner reads what the optimizer itself sees. Whatever wrapper DeepSpeed
puts around the torch optimizer (FP16_Optimizer for ZeRO-0 half precision,
BF16_Optimizer for ZeRO-1 with fp32 accumulation, the ZeRO 1/2/3 optimizers),
it ends in the *basic* optimizer's ``step()`` on fp32 tensors whose ``.grad`` is
the reduced, averaged, unscaled and clipped gradient. A step pre-hook
(``Optimizer.register_step_pre_hook``) copies those gradients; the tensors
themselves are the masters. The hook sees them *after* clipping, which rescales
a wrong gradient back to the length of a right one; ``ParitySession.unclipped``
undoes DeepSpeed's own coefficient, from the pre-clip norm DeepSpeed computed,
so what is compared is the reduced gradient before clipping (and that norm is
checked on its own). Where each parameter lives in them is read from
the engine, not assumed (:func:`locate`):

* ``module``: the module's parameters are the optimizer's (ZeRO-0 fp32).
* ``hp_mapping``: ZeRO-1/2 and BF16_Optimizer give every parameter a
  ``_hp_mapping`` whose ``hp_fragment`` is a view into a flat fp32 partition
  and whose ``lp_fragment_address`` says where in the parameter it belongs.
* ``flat_groups``: FP16_Optimizer (the module's half-precision parameters are
  views into ``fp16_groups_flat[i]``, the masters ``fp32_groups_flat[i]``
  have the same layout; FP16_UnfusedOptimizer pairs them one by one in
  ``fp16_groups[i][j]`` / ``fp32_groups[i][j]``) and ZeRO-3 (``param.ds_tensor`` views into
  ``fp16_partitioned_groups_flat[i]``, masters in
  ``fp32_partitioned_groups_flat[i]``).

Each rank holds *fragments*; a partitioned layout is checked at start-up to
cover every element of every trainable parameter exactly once across ranks, a
replicated one on every rank. Anything else (an unknown wrapper, NVMe-swapped
masters) falls back to DeepSpeed's public API and says so in the header.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

# (attribute of the module-precision flat groups, attribute of the fp32 groups, masters partitioned)
FLAT_GROUPS = (("fp16_groups_flat", "fp32_groups_flat", False),
               ("fp16_partitioned_groups_flat", "fp32_partitioned_groups_flat", True))


@dataclass(frozen=True)
class Fragment:
    """One contiguous piece of a parameter's master held by this rank."""

    name: str
    flat: torch.Tensor  # a tensor the basic optimizer updates
    offset: int  # first element of the piece in ``flat`` (flattened)
    start: int  # first element of the piece in the full parameter (flattened)
    numel: int


@dataclass
class Layout:
    how: str  # module | hp_mapping | flat_groups | paired_groups
    partitioned: bool
    fragments: list[Fragment]
    shapes: dict[str, torch.Size] = field(default_factory=dict)


def basic_optimizer(engine: Any) -> Any:
    """The torch optimizer at the bottom of DeepSpeed's wrappers (the one that updates the masters)."""
    opt = getattr(engine, "basic_optimizer", None)
    if opt is None:
        opt = engine.optimizer
        while hasattr(opt, "optimizer") and not isinstance(opt, torch.optim.Optimizer):
            opt = opt.optimizer
    return opt


def optimizer_steps(engine: Any) -> int:
    """How many steps the basic optimizer has taken (its state's largest ``step``; 0 when it has none)."""
    steps = 0
    for state in basic_optimizer(engine).state.values():
        step = state.get("step") if isinstance(state, dict) else None
        if step is not None:
            steps = max(steps, int(step.item() if hasattr(step, "item") else step))
    return steps


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _container(view: torch.Tensor, flats: list[torch.Tensor]) -> torch.Tensor | None:
    return next((f for f in flats if _same_storage(view, f) and f.dtype == view.dtype), None)


def _module_layout(named: list[tuple[str, Any]], masters: list[torch.Tensor]) -> Layout | None:
    ids = {id(m) for m in masters}
    trainable = [(n, p) for n, p in named if p.requires_grad]
    if not trainable or not all(id(p) in ids for _, p in trainable):
        return None
    return Layout("module", False, [Fragment(n, p, 0, 0, p.numel()) for n, p in trainable])


def _hp_layout(named: list[tuple[str, Any]], masters: list[torch.Tensor]) -> Layout | None:
    if not any(hasattr(p, "_hp_mapping") for _, p in named):
        return None
    frags = []
    for name, p in named:
        mapping = getattr(p, "_hp_mapping", None)
        if mapping is None:
            continue  # this rank holds no piece of it (or it is frozen)
        hp = mapping.hp_fragment
        flat = _container(hp, masters)
        if flat is None:
            return None
        frags.append(Fragment(name, flat, hp.storage_offset() - flat.storage_offset(),
                              int(mapping.lp_fragment_address.start), int(mapping.lp_fragment_address.numel)))
    return Layout("hp_mapping", True, frags)


def _flat_layout(opt: Any, named: list[tuple[str, Any]], rank: int) -> Layout | None:
    for lp_attr, hp_attr, partitioned in FLAT_GROUPS:
        lps, hps = getattr(opt, lp_attr, None), getattr(opt, hp_attr, None)
        if not lps or not hps or len(lps) != len(hps):
            continue
        frags = []
        for name, p in named:
            view = p.ds_tensor if partitioned else p
            if not p.requires_grad or view is None:
                continue
            index = next((i for i, lp in enumerate(lps) if _same_storage(view, lp)), None)
            if index is None:
                return None
            offset = view.storage_offset() - lps[index].storage_offset()
            if partitioned:
                part = int(view.ds_numel)
                start = rank * part
                numel = max(0, min(part, int(p.ds_numel) - start))
            else:
                start, numel = 0, p.numel()
            if hps[index].numel() < offset + numel:
                return None  # masters swapped out (NVMe) or laid out otherwise
            if numel:
                frags.append(Fragment(name, hps[index], offset, start, numel))
        return Layout("flat_groups", partitioned, frags)
    return None


def _paired_layout(opt: Any, named: list[tuple[str, Any]]) -> Layout | None:
    """FP16_UnfusedOptimizer: ``fp16_groups[i][j]`` is a module parameter, ``fp32_groups[i][j]`` its master."""
    lps, hps = getattr(opt, "fp16_groups", None), getattr(opt, "fp32_groups", None)
    if not lps or not hps or not all(isinstance(g, (list, tuple)) for g in hps):
        return None
    where = {id(p): (i, j) for i, group in enumerate(lps) for j, p in enumerate(group)}
    frags = []
    for name, p in named:
        if not p.requires_grad:
            continue
        if id(p) not in where:
            return None
        i, j = where[id(p)]
        frags.append(Fragment(name, hps[i][j], 0, 0, p.numel()))
    return Layout("paired_groups", False, frags)


def full_numel(p: Any) -> int:
    return int(getattr(p, "ds_numel", p.numel()))


def full_shape(p: Any) -> torch.Size:
    return getattr(p, "ds_shape", p.shape)


def locate(engine: Any, named: list[tuple[str, Any]], rank: int) -> Layout | None:
    """Where each trainable parameter's master lives on this rank; None when it cannot be read."""
    basic = basic_optimizer(engine)
    masters = [m for g in basic.param_groups for m in g["params"]]
    layout = (_module_layout(named, masters) or _hp_layout(named, masters)
              or _flat_layout(engine.optimizer, named, rank) or _paired_layout(engine.optimizer, named))
    if layout is not None:
        layout.shapes = {n: full_shape(p) for n, p in named if p.requires_grad}
    return layout


def covers_every_element(layout: Layout, named: list[tuple[str, Any]], device: Any, group: Any = None) -> bool:
    """Collective: every element of every trainable parameter held once (partitioned) or by all (replicated)."""
    trainable = [(n, p) for n, p in named if p.requires_grad]
    sizes = {n: full_numel(p) for n, p in trainable}
    total = sum(sizes.values())
    offsets, at = {}, 0
    for n, _ in trainable:
        offsets[n], at = at, at + sizes[n]
    count = torch.zeros(total, dtype=torch.float32, device=device)
    for f in layout.fragments:
        if f.name in offsets:
            count[offsets[f.name] + f.start: offsets[f.name] + f.start + f.numel] += 1
    if layout.partitioned:
        dist.all_reduce(count, op=dist.ReduceOp.SUM, group=group)
    ok = torch.tensor([float(bool(total) and bool((count == 1).all()))], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return bool(ok.item())


#: DeepSpeed's clipping adds this to the norm before dividing (ZeRO 1/2/3, FP16/BF16 optimizers, torch's clip)
CLIP_EPS = 1e-6


def as_norm(value: Any) -> float | None:
    """A norm DeepSpeed reported (float or tensor) as a float; None when absent, negative or not finite."""
    if value is None:
        return None
    x = float(value.item() if hasattr(value, "item") else value)
    return x if math.isfinite(x) and x >= 0 else None


def clip_coefficient(norm: float, clip: float) -> float:
    """What DeepSpeed multiplies the gradient by when it clips to ``clip`` a gradient of norm ``norm``."""
    if clip <= 0:
        return 1.0
    return 1.0 / max(1.0, (norm + CLIP_EPS) / clip)


class AppliedState:
    """Copies the gradients the basic optimizer steps with; reads its masters after the step."""

    def __init__(self, engine: Any, layout: Layout) -> None:
        self.layout = layout
        self.engine = engine
        self.grads: dict[int, torch.Tensor] = {}
        self.calls = 0
        self.fp32_norm: float | None = None
        basic_optimizer(engine).register_step_pre_hook(self._capture)
        self._watch_fp32_clipping(engine)

    def _watch_fp32_clipping(self, engine: Any) -> None:
        """ZeRO-0 fp32 clips with torch's clip_grad_norm_ and keeps no norm: note it just before.

        An instance attribute shadows the engine's method for this engine only; the
        gradients are replicated there, so this rank's norm is the global one.
        """
        clip = getattr(engine, "clip_fp32_gradients", None)
        if not callable(clip):
            return

        def noted() -> Any:
            norms = [p.grad.detach().float().norm() for p in engine.module.parameters() if p.grad is not None]
            self.fp32_norm = float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0
            return clip()

        engine.clip_fp32_gradients = noted

    def pre_clip_norm(self) -> float | None:
        """The global gradient norm DeepSpeed clipped by at the last step (None when it kept none)."""
        norm = as_norm(self.engine.get_global_grad_norm())
        return norm if norm is not None else as_norm(self.fp32_norm)

    def _capture(self, opt: Any, _args: Any, _kwargs: Any) -> None:
        # ZeRO steps one sub-group at a time, swapping param_groups: every call adds its tensors.
        self.calls += 1
        for group in opt.param_groups:
            for t in group["params"]:
                if t.grad is not None:
                    self.grads[id(t)] = t.grad.detach().float().reshape(-1).clone()

    def begin_step(self) -> None:
        self.grads.clear()
        self.calls = 0
        self.fp32_norm = None

    def owned(self, what: str) -> list[tuple[str, int, torch.Tensor]]:
        """This rank's pieces of the applied gradient (``grad``) or of the masters (``param``)."""
        out = []
        for f in self.layout.fragments:
            if what == "grad":
                src = self.grads.get(id(f.flat))
                if src is None:
                    continue
            else:
                src = f.flat.detach().reshape(-1)
            out.append((f.name, f.start, src[f.offset:f.offset + f.numel].float().clone()))
        return out

    def full(self, owned: list[tuple[str, int, torch.Tensor]], device: Any, group: Any = None
             ) -> dict[str, torch.Tensor]:
        """Collective over ``group`` (default: all ranks): whole fp32 tensors from every rank's pieces
        (partitioned), or this rank's own (replicated)."""
        shapes = self.layout.shapes
        flat = {n: torch.zeros(int(torch.Size(s).numel()), dtype=torch.float32, device=device)
                for n, s in shapes.items()}
        present = torch.zeros(len(shapes), dtype=torch.float32, device=device)
        index = {n: i for i, n in enumerate(shapes)}
        for name, start, piece in owned:
            flat[name][start:start + piece.numel()] = piece.to(device)
            present[index[name]] = 1.0
        if self.layout.partitioned:
            for t in flat.values():
                dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
            dist.all_reduce(present, op=dist.ReduceOp.MAX, group=group)
        return {n: flat[n].reshape(shapes[n]) for n in shapes if present[index[n]] > 0}
