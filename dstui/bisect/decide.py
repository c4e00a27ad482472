"""Good, bad or undecided: one commit's runs against the good commit's, with ``dstui compare``'s statistics.

The numbers come from :func:`dstui.analysis.revision_compare.compare` (the same
per-run samples, Welch test and ratio interval as ``dstui compare``); this
module only turns its :class:`Comparison` into a bisect verdict:

* ``iter_time`` (higher is worse): **bad** when the slowdown is significant
  (p < alpha) and its point estimate reaches the threshold; **good** when the
  interval's upper end stays below 1 + threshold (a slowdown that large is
  ruled out); otherwise **undecided**: more repeats narrow the interval.
* ``loss``: **bad** when the largest per-step gap of the mean loss curves
  exceeds the loss tolerance (``dstui compare --loss-tol``; NaN on one side
  counts as infinite), else good. Losses of a seeded fp32 run repeat exactly,
  so one run per commit is enough.
* ``mem_peak`` (higher is worse): **bad** when the mean peak grew by more than
  the threshold; peaks of a fixed configuration repeat closely, so no test.

* ``verdict``: the run's own check (a ``kind: verify`` batch, or a train run
  with ``sp_check: true``): **bad** when a run says FAIL, **good** when every
  run says PASS. Needs no baseline: PASS/FAIL is absolute.
* any other recorded metric (a field of the runs' step or summary records,
  e.g. ``grad_max_abs_diff``, or a ratio of two such as
  ``grad_norm/grad_norm_baseline``): **bad** when, at some step, the mean over
  runs differs from the good commit's by more than the threshold (absolute in
  the metric's unit, or relative to the good value when given as ``5%``).

A commit without usable runs (all crashed) is **skip**, like ``git bisect skip``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dstui.analysis.revision_compare import Comparison, RunSample, compare, mean_curve
from dstui.bisect.search import BAD, GOOD, SKIP
from dstui.core.metric_catalogue import BISECT, names_in

UNDECIDED = "undecided"
VERDICT = "verdict"
METRICS = (*names_in(BISECT), VERDICT)  # and any recorded metric, see is_recorded
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,63}")
BASE, CANDIDATE = "good", "candidate"


@dataclass(frozen=True)
class Decision:
    """A verdict, why, and the measured change in words (with its interval where there is one)."""

    verdict: str
    why: str
    change: str = ""


def _as(samples: Sequence[RunSample], revision: str) -> list[RunSample]:
    return [
        RunSample("c", revision, s.iter_time_mean, s.mem_peak, dict(s.loss), s.usable) for s in samples
    ]


def comparison(base: Sequence[RunSample], runs: Sequence[RunSample], *, loss_tol: float) -> Comparison:
    """``dstui compare``'s comparison of a commit's runs with the good commit's."""
    return compare(_as(base, BASE) + _as(runs, CANDIDATE), BASE, loss_tol=loss_tol)[0]


def change_text(metric: str, c: Comparison) -> str:
    """The measured change of ``metric``, e.g. '+12.3% iteration time (95% CI +8.1% to +16.4%, p=0.002)'."""
    if metric == "iter_time":
        if c.ratio is None:
            return "no iteration time measured"
        text = f"{(c.ratio - 1) * 100:+.1f}% iteration time"
        extra = []
        if c.ratio_ci:
            extra.append(f"95% CI {(c.ratio_ci[0] - 1) * 100:+.1f}% to {(c.ratio_ci[1] - 1) * 100:+.1f}%")
        if c.p_value is not None:
            extra.append(f"p={c.p_value:.2g}")
        extra.append(f"n={c.n} vs {c.n_base}")
        return f"{text} ({', '.join(extra)})"
    if metric == "mem_peak":
        if c.mem_diff is None or not c.base_mem_peak:
            return "no peak memory measured"
        return f"{c.mem_diff / c.base_mem_peak * 100:+.1f}% peak memory ({c.mem_diff / 2**30:+.3f} GiB)"
    if c.loss_max_diff is None:
        return "no common loss steps"
    return (
        f"max |loss difference| {c.loss_max_diff:.4g} at step {c.loss_max_step} over {c.loss_steps} steps "
        f"(tolerance {c.loss_tol:g}; exact per step, no interval)"
    )


def decide(
    metric: str,
    base: Sequence[RunSample],
    runs: Sequence[RunSample],
    *,
    threshold: float,
    loss_tol: float,
    alpha: float = 0.05,
) -> Decision:
    """The verdict for one commit; ``threshold`` is relative (0.05 = 5%)."""
    if not any(r.usable for r in runs):
        return Decision(SKIP, "no run finished (crashed)")
    c = comparison(base, runs, loss_tol=loss_tol)
    change = change_text(metric, c)
    if metric == "loss":
        if c.loss_max_diff is None:
            return Decision(SKIP, "no loss steps in common with the good commit", change)
        if c.loss_max_diff > loss_tol:
            return Decision(BAD, f"loss differs beyond {loss_tol:g}", change)
        return Decision(GOOD, f"loss within {loss_tol:g}", change)
    if metric == "mem_peak":
        if c.mem_diff is None or not c.base_mem_peak:
            return Decision(SKIP, "no peak memory", change)
        grew = c.mem_diff / c.base_mem_peak
        return Decision(BAD if grew > threshold else GOOD, f"peak memory {grew * 100:+.1f}% vs threshold {threshold * 100:g}%", change)
    return _iter_time(c, change, threshold, alpha)


def _iter_time(c: Comparison, change: str, threshold: float, alpha: float) -> Decision:
    if c.ratio is None:
        return Decision(SKIP, "no iteration time", change)
    limit = 1 + threshold
    if c.p_value is not None and c.p_value < alpha and c.ratio >= limit:
        return Decision(BAD, f"significantly slower by at least {threshold * 100:g}%", change)
    if c.ratio_ci is not None and math.isfinite(c.ratio_ci[1]) and c.ratio_ci[1] < limit:
        return Decision(GOOD, f"a slowdown of {threshold * 100:g}% is outside the interval", change)
    why = "fewer than 2 runs on a side" if c.ratio_ci is None else f"the interval still reaches {threshold * 100:g}%"
    return Decision(UNDECIDED, why, change)


# -- verdicts of the runs' own checks ---------------------------------------------------------


def is_recorded(metric: str) -> bool:
    """A metric that is no built-in one: a recorded field, or ``a/b`` (their ratio)."""
    return metric not in METRICS


def check_recorded_name(metric: str) -> str | None:
    """Why ``metric`` cannot name a recorded field (None when it can)."""
    parts = metric.split("/")
    if len(parts) > 2 or not all(_FIELD.fullmatch(p) for p in parts):
        return (f"'{metric[:80]}' is neither {', '.join(METRICS)} nor a recorded field "
                "(letters, digits, _ and .; or a ratio 'a/b', e.g. grad_norm/grad_norm_baseline)")  # fmt: skip
    return None


def verdict_decision(samples: Sequence[Mapping]) -> Decision:
    """good when every run's check PASSed, bad when one FAILed, skip when none gave a verdict (crashed)."""
    verdicts = [s for s in samples if s.get("verdict") in ("PASS", "FAIL")]
    if not verdicts:
        reasons = "; ".join(sorted({str(s.get("reason") or s.get("state")) for s in samples})) or "no runs"
        return Decision(SKIP, f"no verdict (crashed: {reasons[:200]})")
    failed = [s for s in verdicts if s["verdict"] == "FAIL"]
    check = str(verdicts[0].get("check") or "verify")
    if failed:
        s = failed[0]
        where = f" at step {s['first_diverging_step']}" if s.get("first_diverging_step") is not None else ""
        why = f": {str(s['verdict_reason'])[:200]}" if s.get("verdict_reason") else ""
        return Decision(BAD, f"{len(failed)} of {len(verdicts)} runs FAIL their {check}",
                        f"{check} FAIL{where}{why}")  # fmt: skip
    return Decision(GOOD, f"{len(verdicts)} of {len(verdicts)} runs PASS their {check}", f"{check} PASS")


# -- any recorded metric against the good commit's ---------------------------------------------


@dataclass(frozen=True)
class Threshold:
    """The largest allowed |difference| from the good value: absolute, or relative to it (``5%``)."""

    value: float
    relative: bool = False

    def text(self) -> str:
        return f"{self.value * 100:g}%" if self.relative else f"{self.value:g}"


def metric_decision(name: str, base: Sequence[Mapping[int, float]], runs: Sequence[Mapping[int, float]],
                    threshold: Threshold) -> Decision:  # fmt: skip
    """The largest per-step |difference| of the mean curves against the threshold (NaN on one side: infinite)."""
    if not runs:
        return Decision(SKIP, f"no run recorded {name}")
    b, c = mean_curve(base), mean_curve(runs)  # dstui compare's per-step mean over repeats
    common = sorted(set(b) & set(c))
    if not common:
        return Decision(SKIP, f"no {name} at a step the good commit has")
    worst_step, worst, worst_pair = common[0], -1.0, (b[common[0]], c[common[0]])
    for k in common:
        gap = _gap(b[k], c[k], threshold.relative)
        if gap > worst:
            worst_step, worst, worst_pair = k, gap, (b[k], c[k])
    at = f" at step {worst_step}" if worst_step else ""
    shown = f"{worst * 100:.3g}%" if threshold.relative else f"{worst:.4g}"
    change = (f"{name}: largest |difference| from good {shown}{at} (good {worst_pair[0]:.6g}, "
              f"this {worst_pair[1]:.6g}; threshold {threshold.text()})")  # fmt: skip
    if worst > threshold.value:
        return Decision(BAD, f"{name} differs from the good commit's beyond {threshold.text()}", change)
    return Decision(GOOD, f"{name} within {threshold.text()} of the good commit's", change)


def _gap(base: float, value: float, relative: bool) -> float:
    if math.isnan(base) and math.isnan(value):
        return 0.0
    if math.isnan(base) or math.isnan(value) or math.isinf(base) or math.isinf(value):
        return 0.0 if base == value else math.inf
    diff = abs(value - base)
    if not relative:
        return diff
    return diff / abs(base) if base else (0.0 if diff == 0 else math.inf)
