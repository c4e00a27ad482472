"""Loss parity of each condition against a baseline condition, and choosing that baseline."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dstui.analysis.comparable import numerics_differences, reference_of
from dstui.analysis.rundata import ReportError
from dstui.analysis.stats import ConditionStats, loss_band

NOT_COMPARABLE = "not comparable"


@dataclass
class Parity:
    """Loss of one condition against the baseline's, step by step."""

    label: str
    baseline: str
    common_steps: int
    max_abs_diff: float | None
    mean_abs_diff: float | None
    final_diff: float | None
    tolerance: float
    verdict: str  # PASS, FAIL, NOT_COMPARABLE or n/a
    note: str = ""
    compared_with: str = ""  # the condition whose loss was compared: the baseline, or one with the same numerics
    not_comparable: str = ""  # why this condition's numerics differ from the baseline's ('' when they do not)
    speedup: float | None = None  # baseline iter time / this iter time
    mem_ratio: float | None = None  # this peak memory / baseline's

    def as_row(self) -> dict[str, Any]:
        return dict(self.__dict__)


def loss_parity(
    conds: Sequence[ConditionStats], baseline: str, tolerance: float
) -> list[Parity]:
    """PASS/FAIL per condition: max |mean loss - reference mean loss| <= tolerance.

    The reference is the baseline when both should compute the same numbers
    (:mod:`dstui.analysis.comparable`). A condition whose settings change the
    numerics by design (micro batch, dtype, ...) is compared with the first
    other condition that has its numerics, if there is one, and otherwise gets
    :data:`NOT_COMPARABLE` with the reason: its loss differs by design.
    """
    by_label = {c.label: c for c in conds}
    base = by_label[baseline]
    out = []
    for i, c in enumerate(conds):
        if c.label == baseline:
            continue
        diffs = numerics_differences(c.runs, base.runs)
        why = "; ".join(d.text() for d in diffs[:3]) + ("; ..." if len(diffs) > 3 else "")
        ref = base
        if diffs:
            earlier = [o for o in conds[:i] if o.label != baseline]  # by position: list.index compares whole dataclasses
            ref = reference_of(c, earlier)  # type: ignore[assignment]
        if ref is None:
            p = Parity(c.label, baseline, 0, None, None, None, tolerance, NOT_COMPARABLE, not_comparable=why)
            p.note = f"differs from the baseline by design ({why})"
            out.append(p)
            continue
        p = _compare(c, ref, tolerance)
        p.baseline, p.not_comparable = baseline, why
        if ref is not base:
            p.note = f"compared with {ref.label} (same numerics; the baseline differs: {why})" + (
                f"; {p.note}" if p.note else "")
        out.append(p)
    return out


def _compare(c: ConditionStats, ref: ConditionStats, tolerance: float) -> Parity:
    """One condition's loss against a reference condition's, step by step."""
    import numpy as np

    p = Parity(c.label, ref.label, 0, None, None, None, tolerance, "n/a", compared_with=ref.label)
    if ref.iter_time_mean and c.iter_time_mean:
        p.speedup = ref.iter_time_mean / c.iter_time_mean
    if ref.mem_peak_max and c.mem_peak_max:
        p.mem_ratio = c.mem_peak_max / ref.mem_peak_max
    band, base_band = loss_band(c), loss_band(ref)
    if base_band is None or band is None:
        if band is None:
            p.note = "no usable runs" if not c.n_usable else "no loss history"
        else:
            p.note = f"{ref.label} has no loss history"
        return p
    common, ia, ib = np.intersect1d(band[0], base_band[0], return_indices=True)
    p.common_steps = int(len(common))
    if not len(common):
        p.note = "no common steps"
        return p
    # one NaN rule with `dstui compare` (revision_compare.max_loss_diff): a NaN on one side only is
    # an infinite difference (a diverged run is never parity); NaN on both sides at a step is skipped
    a, b = band[1][ia], base_band[1][ib]
    both = np.isnan(a) & np.isnan(b)
    diff = np.abs(a - b)[~both]
    if np.isnan(diff).any() or not len(diff):
        p.verdict = "FAIL"
        p.note = "NaN loss" if len(diff) else "NaN loss on both sides at every common step"
        p.max_abs_diff = float("inf") if len(diff) else float("nan")
    else:
        p.max_abs_diff = float(diff.max())
        p.mean_abs_diff = float(diff.mean())
        p.verdict = "PASS" if p.max_abs_diff <= tolerance else "FAIL"
    p.final_diff = float(band[1][ia][-1] - base_band[1][ib][-1])
    return p


def choose_baseline(conds: Sequence[ConditionStats], requested: str | None) -> str | None:
    """The requested condition (by label or condition name), else the first usable train one."""
    if requested:
        for c in conds:
            if requested in (c.label, c.condition):
                return c.label
        known = ", ".join(c.label for c in conds)
        raise ReportError(f"baseline '{requested}' is not among the conditions ({known})")
    for c in conds:
        if c.kind != "verify" and c.n_usable:
            return c.label
    return None




# ULPs of the training dtype that a loss may move by between two correct
# implementations (reduction order differs between ZeRO stages, offload, kernels)
_DTYPE_EPS = {"bf16": 2.0**-8, "fp16": 2.0**-11}
_ULPS = 32
FP32_TOLERANCE = 1e-3  # the one fp32 default of reports and `dstui compare`
NOISE_FACTOR = 3.0


def default_tolerance(conds: Sequence[ConditionStats]) -> tuple[float, str]:
    """The loss-parity tolerance when none is given, and a sentence saying how it was derived.

    * dtype: fp32 keeps 1e-3; bf16/fp16 allow ``32 ulp x median |loss|`` (a bf16
      ulp near a loss of 8 is 0.03; 1e-3 would FAIL every bf16 cross-stage
      comparison on the seeds' logs);
    * run-to-run noise: where a condition has 2+ repeats with losses, the largest
      per-step spread (max - min) between its repeats, times 3: a difference
      within what the same condition does twice is no evidence of a bug.

    The larger of the two is used.
    """
    import numpy as np

    dtypes = {str(r.param("dtype", "fp32")).lower() for c in conds for r in c.runs}
    eps = max((_DTYPE_EPS.get(d, 0.0) for d in dtypes), default=0.0)
    tol, basis = FP32_TOLERANCE, "fp32 default 1e-3"
    if eps:
        levels = []
        for c in conds:
            band = loss_band(c)
            if band is not None and np.isfinite(band[1]).any():
                levels.append(float(np.nanmedian(np.abs(band[1]))))
        level = float(np.median(levels)) if levels else 1.0
        tol = _ULPS * eps * level
        dt = "/".join(sorted(d for d in dtypes if d in _DTYPE_EPS))
        basis = f"{dt}: {_ULPS} ulp ({eps:g}) x median |loss| {level:.3g} = {tol:.3g}"
    noise = 0.0
    for c in conds:
        band = loss_band(c)
        if band is None or sum(1 for r in c.runs if r.usable and "loss" in r.history) < 2:
            continue
        spread = band[3] - band[2]
        if np.isfinite(spread).any():
            noise = max(noise, float(np.nanmax(spread)))
    if noise and NOISE_FACTOR * noise > tol:
        tol = NOISE_FACTOR * noise
        basis = f"run-to-run noise: {NOISE_FACTOR:g} x largest spread between repeats {noise:.3g} = {tol:.3g}"
    return tol, basis
