"""Revision vs baseline statistics: the numbers behind ``dstui compare``.

Pure computation on per-run figures so that it is testable with known inputs
and reusable by the TUI's results view; fetching from MLflow lives in
:mod:`dstui.usecases.results`.

Definitions (the command prints them too, so nobody has to guess):

* a run's iteration time is its mean over the steps after warm-up; a
  revision's iteration time is the mean ± sample std (n-1) of those per-run
  means across repeats. Repeats, not steps, are the independent samples:
  steps of one run share the machine state and are strongly correlated.
* ratio = revision mean / baseline mean. Its 95% interval is Fieller's
  interval for a ratio of means (:mod:`dstui.analysis.intervals`): never
  negative, asymmetric where the data are, absent with fewer than 2 repeats
  on a side ("too few repeats") and flagged with fewer than 3. The Welch t
  interval of the difference of means is kept as ``diff_ci`` (seconds).
* significance: Welch's two-sided t-test (``scipy.stats.ttest_ind`` with
  ``equal_var=False``) on the per-run means, alpha 0.05. It needs at least two
  repeats on each side.
* peak memory: mean over repeats of each run's peak; difference in bytes.
* loss: per-step mean over repeats; the largest absolute difference between
  the two mean curves on the steps both logged, and where it happens.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from dstui.analysis.intervals import METHOD as INTERVAL_METHOD
from dstui.analysis.intervals import fieller_ratio
from dstui.analysis.parity import FP32_TOLERANCE

ALPHA = 0.05
CONFIDENCE = 0.95
DEFAULT_LOSS_TOL = FP32_TOLERANCE
METHOD = (
    "iteration time = per-run mean excluding warm-up, mean ± std across repeats; "
    f"ratio interval = {INTERVAL_METHOD}; "
    "test = Welch's two-sided t-test (scipy.stats.ttest_ind, equal_var=False), alpha 0.05; "
    "loss = largest |difference| of per-step mean-of-repeats curves"
)


@dataclass(frozen=True)
class RunSample:
    """What one run contributes: its post-warm-up mean iteration time, peak memory, loss curve."""

    condition: str
    revision: str
    iter_time_mean: float | None = None
    mem_peak: float | None = None
    loss: dict[int, float] = field(default_factory=dict)
    usable: bool = True


@dataclass
class Comparison:
    """One condition, one revision against the baseline revision."""

    condition: str
    revision: str
    baseline: str
    n: int = 0
    n_base: int = 0
    n_failed: int = 0
    n_failed_base: int = 0
    mean: float | None = None
    std: float | None = None
    base_mean: float | None = None
    base_std: float | None = None
    ratio: float | None = None
    ratio_ci: tuple[float, float] | None = None
    ratio_note: str = ""  # why there is no interval, or a small-sample warning
    diff_ci: tuple[float, float] | None = None
    p_value: float | None = None
    significant: bool | None = None
    mem_peak: float | None = None
    base_mem_peak: float | None = None
    mem_diff: float | None = None
    loss_max_diff: float | None = None
    loss_max_step: int | None = None
    loss_steps: int = 0
    loss_curves: bool = False
    loss_tol: float = DEFAULT_LOSS_TOL
    verdict: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _clean(values: Iterable[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and sample std (n-1); std is None for a single value."""
    if not values:
        return None, None
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, None
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def welch_diff_ci(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Welch t interval for mean(a) - mean(b); None when it is undefined (n<2 or no variance)."""
    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        return None
    ma, sa = mean_std(a)
    mb, sb = mean_std(b)
    assert ma is not None and mb is not None and sa is not None and sb is not None
    va, vb = sa**2 / len(a), sb**2 / len(b)
    se2 = va + vb
    if se2 == 0:
        return None
    df = se2**2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, df)) * math.sqrt(se2)
    d = ma - mb
    return d - half, d + half


def welch_p(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided Welch t-test p-value; None when undefined."""
    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        return None
    res = stats.ttest_ind(a, b, equal_var=False)
    p = float(res.pvalue)
    return p if math.isfinite(p) else None


def mean_curve(curves: Sequence[Mapping[int, float]]) -> dict[int, float]:
    """Per-step mean over the repeats that logged that step (NaN stays NaN: it must show)."""
    acc: dict[int, list[float]] = {}
    for c in curves:
        for step, v in c.items():
            acc.setdefault(int(step), []).append(float(v))
    return {s: sum(vs) / len(vs) for s, vs in sorted(acc.items())}


def max_loss_diff(a: dict[int, float], b: dict[int, float]) -> tuple[float | None, int | None, int]:
    """Largest |a - b| over common steps, its step, and how many steps were compared.

    A NaN on one side only counts as an infinite difference (a diverged run
    must not look like parity); NaN on both sides is skipped.
    """
    common = sorted(set(a) & set(b))
    worst: float | None = None
    where: int | None = None
    for s in common:
        x, y = a[s], b[s]
        if math.isnan(x) and math.isnan(y):
            continue
        d = math.inf if (math.isnan(x) or math.isnan(y)) else abs(x - y)
        if worst is None or d > worst:
            worst, where = d, s
    return worst, where, len(common)


def compare(
    samples: Sequence[RunSample], baseline: str, *, loss_tol: float = DEFAULT_LOSS_TOL
) -> list[Comparison]:
    """Every (condition, revision != baseline) against the baseline of the same condition."""
    by: dict[tuple[str, str], list[RunSample]] = {}
    for s in samples:
        by.setdefault((s.condition, s.revision), []).append(s)
    conditions = list(dict.fromkeys(s.condition for s in samples))
    revisions = list(dict.fromkeys(s.revision for s in samples))
    out: list[Comparison] = []
    for cond in conditions:
        base_runs = by.get((cond, baseline), [])
        for rev in revisions:
            if rev == baseline or (cond, rev) not in by:
                continue
            out.append(_compare_one(cond, rev, baseline, by[(cond, rev)], base_runs, loss_tol))
    return out


def _compare_one(
    cond: str, rev: str, baseline: str, runs: list[RunSample], base: list[RunSample], loss_tol: float
) -> Comparison:
    ok = [r for r in runs if r.usable]
    ok_b = [r for r in base if r.usable]
    c = Comparison(cond, rev, baseline, n_failed=len(runs) - len(ok), n_failed_base=len(base) - len(ok_b), loss_tol=loss_tol)
    a = _clean(r.iter_time_mean for r in ok)
    b = _clean(r.iter_time_mean for r in ok_b)
    c.n, c.n_base = len(a), len(b)
    c.mean, c.std = mean_std(a)
    c.base_mean, c.base_std = mean_std(b)
    if c.mean is not None and c.base_mean:
        c.ratio = c.mean / c.base_mean
        c.diff_ci = welch_diff_ci(a, b)
        ri = fieller_ratio(a, b)
        c.ratio_note = ri.note
        if ri.bounded:
            c.ratio_ci = (ri.low, ri.high)  # type: ignore[assignment]
        c.p_value = welch_p(a, b)
        if c.p_value is not None:
            c.significant = c.p_value < ALPHA
    mem = _clean(r.mem_peak for r in ok)
    mem_b = _clean(r.mem_peak for r in ok_b)
    c.mem_peak, _ = mean_std(mem)
    c.base_mem_peak, _ = mean_std(mem_b)
    if c.mem_peak is not None and c.base_mem_peak is not None:
        c.mem_diff = c.mem_peak - c.base_mem_peak
    curve, curve_b = mean_curve([r.loss for r in ok if r.loss]), mean_curve([r.loss for r in ok_b if r.loss])
    c.loss_curves = bool(curve and curve_b)
    c.loss_max_diff, c.loss_max_step, c.loss_steps = max_loss_diff(curve, curve_b)
    c.verdict = verdict(c)
    return c


def _pct(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 10 else f"{x:.1f}"


def verdict(c: Comparison) -> str:
    """One line a reader can act on: speed, then loss parity when it fails."""
    parts: list[str] = []
    if not c.n_base:
        parts.append(f"no usable baseline runs ('{c.baseline}')")
    elif not c.n:
        parts.append("no usable runs")
    elif c.ratio is None:
        parts.append("no iteration time to compare")
    elif c.significant is None:
        why = "fewer than 2 repeats on a side" if min(c.n, c.n_base) < 2 else "no variance"
        parts.append(f"ratio {c.ratio:.3f}, not tested ({why})")
    elif not c.significant:
        parts.append(f"no significant change (ratio {c.ratio:.3f}, p={c.p_value:.2g})")
    else:
        change = (1 - c.ratio) * 100
        word = "faster" if change > 0 else "slower"
        ci = ""
        if c.ratio_ci:
            ci = f" (ratio {c.ratio:.3f}, 95% CI [{c.ratio_ci[0]:.3f}, {c.ratio_ci[1]:.3f}])"
        parts.append(f"{word} by {_pct(abs(change))}%{ci}")
    if c.loss_max_diff is not None and c.loss_max_diff > c.loss_tol:
        parts.append(f"loss differs beyond tolerance at step {c.loss_max_step} (|diff| {c.loss_max_diff:.3g} > {c.loss_tol:g})")
    elif c.loss_curves and c.loss_max_diff is None:
        parts.append("no common loss steps")
    if c.ratio_note and min(c.n, c.n_base) >= 2:
        parts.append(c.ratio_note)
    if c.n_failed or c.n_failed_base:
        parts.append(f"failed runs excluded: {c.n_failed} revision, {c.n_failed_base} baseline")
    return "; ".join(parts)


def samples_from_runs(runs: Sequence[Any]) -> list[RunSample]:
    """One :class:`RunSample` per :class:`~dstui.analysis.rundata.RunData` (stats already computed).

    The one conversion used by ``dstui compare``, the report and the TUI, so
    they compare the same numbers. Only finished runs (state ``done``) count;
    runs that never started are no sample at all. A condition is its grouped
    label without the revision (:mod:`dstui.analysis.grouping`), so batches that
    ran one name with different settings are never compared as one condition.
    """
    out = []
    for r in runs:
        if not r.started:
            continue
        st = r.stats
        steps, values = r.history.get("loss", ((), ()))
        out.append(
            RunSample(
                condition=r.condition_label or r.condition,
                revision=r.revision,
                iter_time_mean=st.get("iter_time_mean"),
                mem_peak=st.get("mem_peak_max"),
                loss={int(s): float(v) for s, v in zip(steps, values, strict=False)},
                usable=r.status == "done",
            )
        )
    return out
