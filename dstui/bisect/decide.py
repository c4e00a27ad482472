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

A commit without usable runs (all crashed) is **skip**, like ``git bisect skip``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dstui.analysis.revision_compare import Comparison, RunSample, compare
from dstui.bisect.search import BAD, GOOD, SKIP

UNDECIDED = "undecided"
METRICS = ("iter_time", "loss", "mem_peak")
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
