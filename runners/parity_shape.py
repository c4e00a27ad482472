"""The shape of a gradient error: what a verdict says besides "the gradients differ".

The gradient-norm ratio alone told issue 37's real bugs from false alarms: a
missing 1/GAS is *exactly* 0.25 at grad_accum 4, a rank that applies its own
gradient instead of the average shows as about sqrt(world), rounding as 1 to
a few parts in 10^4. This module turns DeepSpeed's applied gradient ``d`` and
the baseline's ``g`` (plus the baseline's explanations: each rank's own
unreduced gradient ``l`` and each micro-step's reduced share ``m_k``) into
that ratio and a named shape:

* ``rounding-level``: ``|d - g| / |g|`` within the tolerance;
* ``uniform scale c``: ``d`` is ``c * g`` up to the tolerance (``c`` fitted by
  least squares), named when it is a ratio a reduction bug makes: 1/GAS,
  1/GAS², GAS, (W-1)/W, 1/W, W, 2, 1/2;
* ``rank-local``: ``d`` is each rank's own gradient, never all-reduced;
* ``micro-batch k dropped``: ``d`` is ``g - m_k``;
* ``no simple shape``: with the fitted scale and the cosine.

Only sums of products are needed, so every rank folds the pieces it holds
(:func:`terms`) and one all-reduce adds them up; torch only, no process group
here (tests/unit/test_parity_units.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# A named explanation must account for this share of the error at least (its residual below
# EXPLAINS x the distance to the baseline), else the shape is "no simple shape".
EXPLAINS = 0.05
# Two scales are "the same" simple fraction within this relative distance.
SCALE_MATCH = 2e-3


@dataclass(frozen=True)
class Shape:
    ratio: float  # |d| / |g|
    rel: float  # |d - g| / |g|
    scale: float  # least-squares c in d ~ c g
    kind: str  # rounding-level | uniform | rank-local | micro-batch | no simple shape | no gradient
    text: str  # one phrase for the reason, status and report


def terms(pieces: list[tuple[str, int, torch.Tensor]], grads: dict[str, torch.Tensor],
          local: dict[str, torch.Tensor], micro: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    """Sums over this rank's pieces: [d.d, g.g, d.g, |d-l|^2, |d-(g-m_1)|^2, ...] (float64)."""
    out = torch.zeros(4 + len(micro), dtype=torch.float64)
    for name, start, d in pieces:
        if name not in grads:
            continue
        sl = slice(start, start + d.numel())
        dd = d.detach().double().cpu()
        g = grads[name].detach().reshape(-1)[sl].double().cpu()
        out[0] += dd.dot(dd)
        out[1] += g.dot(g)
        out[2] += dd.dot(g)
        if name in local:
            out[3] += (dd - local[name].reshape(-1)[sl].double().cpu()).pow(2).sum()
        for k, share in enumerate(micro):
            if name in share:
                out[4 + k] += (dd - g + share[name].reshape(-1)[sl].double().cpu()).pow(2).sum()
    return out


def scale_name(c: float, *, gas: int, world: int) -> str:
    """'1/GAS' for 0.25 at grad_accum 4, ... ; '' when ``c`` is no ratio a reduction bug makes."""
    names = {"1/GAS": 1 / gas, "1/GAS²": 1 / gas**2, "GAS": gas, "GAS²": gas**2,
             "(W-1)/W": (world - 1) / world, "1/W": 1 / world, "W": world, "2": 2.0, "1/2": 0.5}
    for name, value in names.items():
        if value not in (0, 1) and abs(c - value) <= SCALE_MATCH * abs(value):
            return name
    return ""


def classify(t: list[float], *, gas: int, world: int, tol: float, has_local: bool) -> Shape:
    """Name the shape of ``d`` against ``g`` from the summed :func:`terms` (``tol``: relative to |g|)."""
    dd, gg, dg = t[0], t[1], t[2]
    if gg <= 0:
        return Shape(math.nan, math.nan, math.nan, "no gradient", "no baseline gradient to compare")
    norm_g = math.sqrt(gg)
    ratio = math.sqrt(max(dd, 0.0)) / norm_g
    rel = math.sqrt(max(dd - 2 * dg + gg, 0.0)) / norm_g
    c = dg / gg
    resid = math.sqrt(max(dd - c * dg, 0.0)) / norm_g
    head = f"grad-norm ratio {ratio:.4f}"
    if rel == 0:
        return Shape(ratio, rel, c, "rounding-level", f"{head}, identical")
    if rel <= tol:
        return Shape(ratio, rel, c, "rounding-level", f"{head}, rounding-level (|d|/|g| {rel:.1e} <= {tol:.1e})")
    enough = max(tol, EXPLAINS * rel)
    if resid <= enough:
        named = scale_name(c, gas=gas, world=world)
        what = f"uniform scale {c:.4f}" + (f" = {named}" if named else "")
        return Shape(ratio, rel, c, "uniform", f"{head}, {what} (residual {resid:.1e} of |g|)")
    candidates = []
    if has_local:
        candidates.append((math.sqrt(max(t[3], 0.0)) / norm_g, "rank-local",
                           "rank-local: each rank applied its own gradient, not the all-reduced mean"))
    for k in range(4, len(t)):
        candidates.append((math.sqrt(max(t[k], 0.0)) / norm_g, "micro-batch",
                           f"micro-batch {k - 3} of {gas} dropped from the sum"))
    if candidates:
        best, kind, what = min(candidates)
        if best <= enough:
            return Shape(ratio, rel, c, kind, f"{head}, {what} (residual {best:.1e} of |g|)")
    cos = dg / math.sqrt(dd * gg) if dd > 0 else 0.0
    return Shape(ratio, rel, c, "no simple shape",
                 f"{head}, no simple shape (|d-g|/|g| {rel:.3g}, best scale {c:.4f} leaves {resid:.2g}, cos {cos:.4f})")
