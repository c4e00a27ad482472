"""How close is close enough: bit-exact, a given rtol/atol, or a tolerance measured from noise.

``exact``: demanded when DeepSpeed and the baseline do the same arithmetic in
the same order: fp32, at most two ranks (``a + b`` is commutative and halving
is exact, so any placement of the averaging gives the same bits), a torch
optimizer on both sides, no gradient clipping (the clip coefficient depends on
a norm that the two sides sum in different orders), and under ZeRO-3 a
baseline that mirrors its autograd hooks. Anything above zero is then a bug.

``measured``: otherwise. A twin baseline does the same mathematics with every
rounding choice turned the other legitimate way (parity_baseline.py). At each
step and for each kind (loss, grad, param) the noise is the largest
``max|twin - baseline| / max|baseline|`` over the tensors; the tolerance of a
tensor is ``SAFETY`` times the largest noise seen up to that step, times that
tensor's own ``max|baseline|``, and never below ``FLOOR_REL`` of it. Real
reduction bugs (a lost bucket, a doubled gradient, missing 1/GA) are errors of
order 1 in relative terms, far above this band.

``given``: the user's ``rtol``/``atol`` (``torch.allclose`` rules), as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

SAFETY = 10.0
# Never demand more than a few fp32 ulps of a tensor's scale in measured mode.
FLOOR_REL = 8 * torch.finfo(torch.float32).eps
# ... nor of a half-precision run's loss, less than 1e-4 of it. Its logits are bf16/fp16 and its
# weights are rounded to 8 or 11 bits after every update, so from step 2 on it wanders from the
# fp32-master baseline by parts per million, more than the twin's rounding choices move the
# baseline's own loss: ZeRO-1 bf16 with clipping measured 4.7e-6 against a twin noise of 1.5e-7
# (tests/unit/test_compare_loss.py, ga4_z1_bf16_clip), and failed on a loss closer than any bf16
# ulp (3.9e-3 relative). 1e-4 is 20x that and 40x below one ulp; the reduction bugs the check is
# for are errors of order 1 (and show in the gradients first).
HALF_LOSS_FLOOR_REL = 1e-4
KINDS = ("loss", "grad", "param")


def exact_is_possible(*, dtype: str, world: int, clip: float, client_optimizer: bool,
                      stage: int, mirror_zero3_hooks: bool) -> tuple[bool, str]:
    """(True, "") when the arithmetic is the same on both sides, else (False, why not)."""
    reasons = []
    if dtype != "fp32":
        reasons.append(f"{dtype} rounding of reductions and accumulation")
    if world > 2:
        reasons.append(f"{world}-rank sums in an order set by the collective")
    if clip > 0:
        reasons.append("gradient clipping by a norm summed per partition")
    if not client_optimizer:
        reasons.append("DeepSpeed's own optimizer kernel")
    if stage == 3 and not mirror_zero3_hooks:
        reasons.append("ZeRO-3's autograd hooks regroup gradient sums")
    return not reasons, "; ".join(reasons)


def max_abs_rel(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(max|a - b|, max|b|) in float64; NaN counts as infinitely far."""
    d = (a.detach().double().cpu() - b.detach().double().cpu()).abs()
    d = torch.nan_to_num(d, nan=float("inf"))
    scale = float(b.detach().double().abs().max()) if b.numel() else 0.0
    return (float(d.max()) if d.numel() else 0.0), scale


@dataclass
class NoiseEnvelope:
    """Running maximum of the relative baseline-vs-twin distance, per kind."""

    rel: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))
    floor: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, FLOOR_REL))
    l2: float = 0.0  # the whole gradient's relative L2 distance (the gradient-norm evidence's noise)

    def observe(self, kind: str, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        for twin, base in pairs:
            d, scale = max_abs_rel(twin, base)
            if scale > 0:
                self.rel[kind] = max(self.rel[kind], d / scale)

    def observe_l2(self, twin: dict[str, torch.Tensor], base: dict[str, torch.Tensor]) -> None:
        """The whole gradient's relative L2 distance, ``|twin - base| / |base|`` over every tensor at once."""
        num = sum(float((twin[n].double() - b.double()).pow(2).sum()) for n, b in base.items() if n in twin)
        den = sum(float(b.double().pow(2).sum()) for b in base.values())
        if den > 0:
            self.l2 = max(self.l2, (num / den) ** 0.5)

    def atol(self, kind: str, base: torch.Tensor) -> float:
        """Absolute tolerance for one tensor of ``kind`` whose baseline value is ``base``."""
        _, scale = max_abs_rel(base, base)
        return max(SAFETY * self.rel[kind], self.floor[kind]) * scale


@dataclass
class Policy:
    """The rule in force for a run, and what the summary says about it."""

    mode: str  # "exact" | "measured" | "given"
    rtol: float = 0.0
    atol: float = 0.0
    why_not_exact: str = ""
    noise: NoiseEnvelope = field(default_factory=NoiseEnvelope)
    used: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))

    def atol_for(self, kind: str, base: torch.Tensor) -> float:
        if self.mode == "exact":
            return 0.0
        if self.mode == "given":
            return self.atol
        tol = self.noise.atol(kind, base)
        self.used[kind] = max(self.used[kind], tol)
        return tol

    def l2_tol(self) -> float:
        """Tolerance of the whole gradient's ``|d - g| / |g|`` (0.0 when bit-exact)."""
        if self.mode == "exact":
            return 0.0
        if self.mode == "given":
            return max(self.rtol, FLOOR_REL)
        return max(SAFETY * self.noise.l2, FLOOR_REL)

    def rtol_for(self) -> float:
        return self.rtol if self.mode == "given" else 0.0

    def basis(self) -> str:
        if self.mode == "exact":
            return "bit-exact (same arithmetic in the same order on both sides)"
        if self.mode == "given":
            return f"given: rtol={self.rtol:g} atol={self.atol:g}"
        rel = ", ".join(f"{k} {v:.2e}" for k, v in self.noise.rel.items())
        floor = f"at least {FLOOR_REL:.1e} of each tensor's scale"
        if self.noise.floor["loss"] != FLOOR_REL:
            floor += f" ({self.noise.floor['loss']:.0e} of the loss: half precision)"
        return (f"measured: {SAFETY:g} x the largest relative baseline-vs-twin distance "
                f"({rel}; whole gradient L2 {self.noise.l2:.2e}), {floor}; not exact because {self.why_not_exact}")

    def tolerance(self) -> float:
        """The largest absolute tolerance applied (0.0 when bit-exact)."""
        if self.mode == "given":
            return self.atol
        return max(self.used.values())


def choose(requested: str, *, rtol: float, atol: float, can_be_exact: bool, why: str, dtype: str = "fp32") -> Policy:
    """``requested``: auto | exact | measured; a non-zero rtol/atol means "given"."""
    if rtol > 0 or atol > 0:
        return Policy("given", rtol=rtol, atol=atol)
    if requested == "exact" or (requested == "auto" and can_be_exact):
        return Policy("exact", why_not_exact=why)
    policy = Policy("measured", why_not_exact=why or "requested")
    if dtype in ("bf16", "fp16"):
        policy.noise.floor["loss"] = HALF_LOSS_FLOOR_REL
    return policy
