"""Confidence intervals for a ratio of means (revision time / baseline time), built for ratios.

Why not "Welch interval of the difference divided by the baseline mean": it
ignores the baseline mean's own uncertainty and is symmetric around the
ratio, so with two noisy repeats it printed [-4.43, 7.27] for a speed ratio,
which cannot be negative.

Method: **Fieller's interval** for mu_a / mu_b from independent samples with
unequal variances. The set of ratios theta not rejected by the t-test of
``mean(a) - theta * mean(b) = 0`` is::

    (a_bar - theta b_bar)^2 <= t^2 (va + theta^2 vb),   va = s_a^2 / n_a,  vb = s_b^2 / n_b

a quadratic in theta, with t the 0.975 quantile of Student's t with
Welch-Satterthwaite degrees of freedom of ``va + theta_hat^2 vb``. It contains the
point estimate a_bar / b_bar, is asymmetric where the data are, and is bounded
only when the baseline mean is clearly away from zero (otherwise the data do
not bound the ratio and we say so rather than print nonsense). A lower bound
is never below 0: times are positive.

The samples are **per-run means** (one number per repeat): repeats, not the
steps of one run, are the independent samples, so the interval respects
run-to-run variance. Fewer than 2 repeats on a side: no interval ("too few
repeats"); fewer than :data:`RECOMMENDED_REPEATS`: an interval with a warning.

One method for ``dstui compare``, the report's revision section and the TUI.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

CONFIDENCE = 0.95
MIN_REPEATS = 2
RECOMMENDED_REPEATS = 3
METHOD = (
    "95% Fieller interval for the ratio of mean per-run iteration times "
    "(unequal variances, Welch-Satterthwaite df); repeats are the samples"
)


@dataclass(frozen=True)
class RatioInterval:
    """A ratio of means with its interval, or why there is none."""

    ratio: float | None
    low: float | None = None
    high: float | None = None
    n_a: int = 0
    n_b: int = 0
    df: float | None = None
    note: str = ""  # "" when the interval is fine; else a warning or why there is none

    @property
    def bounded(self) -> bool:
        return self.low is not None and self.high is not None

    def text(self, digits: int = 3) -> str:
        """``1.023 [0.910, 1.050]``, or the ratio with the reason it has no interval."""
        if self.ratio is None:
            return "-"
        if not self.bounded:
            return f"{self.ratio:.{digits}f} ({self.note})"
        return f"{self.ratio:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mean_var(x: Sequence[float]) -> tuple[float, float]:
    m = sum(x) / len(x)
    return m, sum((v - m) ** 2 for v in x) / (len(x) - 1)


def few_repeats_note(n_a: int, n_b: int) -> str:
    """The warning for small samples ('' when both sides have enough repeats)."""
    n = min(n_a, n_b)
    if n < MIN_REPEATS:
        return f"too few repeats (n={n_a} vs {n_b}; an interval needs {MIN_REPEATS}+ per side)"
    if n < RECOMMENDED_REPEATS:
        return (
            f"few repeats (n={n_a} vs {n_b}): the interval is wide and rough; "
            f"{RECOMMENDED_REPEATS}+ repeats per side recommended"
        )
    return ""


def fieller_ratio(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE) -> RatioInterval:
    """Fieller's interval for mean(a) / mean(b) (see the module docstring)."""
    from scipy import stats

    a = [float(v) for v in a if v is not None and math.isfinite(v)]
    b = [float(v) for v in b if v is not None and math.isfinite(v)]
    n_a, n_b = len(a), len(b)
    if not a or not b:
        return RatioInterval(None, n_a=n_a, n_b=n_b, note="no samples on one side")
    mean_a, mean_b = sum(a) / n_a, sum(b) / n_b
    if mean_b <= 0:
        return RatioInterval(None, n_a=n_a, n_b=n_b, note="baseline mean is not positive")
    ratio = mean_a / mean_b
    note = few_repeats_note(n_a, n_b)
    if min(n_a, n_b) < MIN_REPEATS:
        return RatioInterval(ratio, n_a=n_a, n_b=n_b, note=note)
    _, var_a = _mean_var(a)
    _, var_b = _mean_var(b)
    va, vb = var_a / n_a, var_b / n_b
    if va + vb <= (1e-12 * max(abs(mean_a), mean_b)) ** 2:  # equal repeats (up to rounding)
        return RatioInterval(ratio, ratio, ratio, n_a, n_b, None, note or "no spread between repeats")
    num = (va + ratio**2 * vb) ** 2
    den = (va**2 / (n_a - 1) if va else 0.0) + (ratio**4 * vb**2 / (n_b - 1) if vb else 0.0)
    df = num / den
    t = float(stats.t.ppf(0.5 + confidence / 2, df))
    qa = mean_b**2 - t**2 * vb  # > 0: the baseline mean is clearly away from zero
    if qa <= 0:
        return RatioInterval(ratio, n_a=n_a, n_b=n_b, df=df, note="too noisy: the data do not bound the ratio")
    qb = mean_a * mean_b
    qc = mean_a**2 - t**2 * va
    disc = qb**2 - qa * qc  # = t^2 (va b^2 + vb a^2 - t^2 va vb) >= 0 when qa > 0
    root = math.sqrt(max(disc, 0.0))
    low, high = (qb - root) / qa, (qb + root) / qa
    return RatioInterval(ratio, max(low, 0.0), high, n_a, n_b, df, note)
