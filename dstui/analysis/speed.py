"""Which condition is faster, in a unit that makes them comparable, and by how much (issue 28.5).

Time per optimizer step compares speed only when every condition does the same
work per step. When tokens per step differ (a micro-batch or sequence-length
axis), 9.5 ms per step of 1 sample is not faster than 15 ms per step of 2:
speed is then compared in tokens per second. :func:`basis` picks the unit once
for a report; every "fastest", "x the speed of the baseline" and trade-off
uses it.

A ratio of speeds is a claim about the mean of repeats. With one usable run on
a side there is no interval and no ratio is claimed: the text says
"n=1, no interval". The interval is :func:`dstui.analysis.intervals.fieller_ratio`
over per-run means (repeats are the independent samples), the same method as
``dstui compare``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from dstui.analysis.intervals import RatioInterval, fieller_ratio
from dstui.analysis.stats import ConditionStats

Basis = Literal["time", "tokens"]


def tokens_per_step_of(c: ConditionStats) -> float | None:
    """The condition's tokens per optimizer step (its usable runs agree; None when unknown)."""
    vals = {r.stats.get("tokens_per_step") for r in c.runs if r.usable} or {r.stats.get("tokens_per_step") for r in c.runs}
    vals.discard(None)
    return next(iter(vals)) if len(vals) == 1 else None


def basis(conds: Sequence[ConditionStats]) -> Basis:
    """'tokens' when the timed conditions' tokens per step differ (or are unknown for some), else 'time'."""
    timed = [c for c in conds if c.iter_time_mean is not None]
    per_step = {tokens_per_step_of(c) for c in timed}
    if len(per_step) <= 1 or (per_step == {None}):
        return "time"
    return "tokens"


def value(c: ConditionStats, how: Basis) -> float | None:
    """The condition's speed figure: mean iteration time (lower is faster) or tokens/s (higher is faster)."""
    return c.iter_time_mean if how == "time" else c.tokens_per_s_mean


def ranked(conds: Sequence[ConditionStats], how: Basis) -> list[ConditionStats]:
    """Conditions with a speed figure, fastest first."""
    have = [c for c in conds if value(c, how) is not None]
    return sorted(have, key=lambda c: value(c, how) if how == "time" else -value(c, how))  # type: ignore[operator, return-value]


def _per_run(c: ConditionStats, how: Basis) -> list[float]:
    key = "iter_time_mean" if how == "time" else "tokens_per_s_mean"
    return [float(r.stats[key]) for r in c.runs if r.usable and r.stats.get(key) is not None]


@dataclass(frozen=True)
class SpeedRatio:
    """How many times the baseline's speed a condition runs at, with its interval or why there is none."""

    ratio: float | None
    interval: RatioInterval
    n: int
    n_base: int

    @property
    def claimable(self) -> bool:
        """A ratio may be stated: both sides have enough repeats for a bounded interval."""
        return self.ratio is not None and self.interval.bounded

    def text(self) -> str:
        """``1.52x [1.40, 1.63] (95% CI, n=3 vs 3)``, or ``n=1, no interval`` (no ratio claimed)."""
        if self.ratio is None:
            return "n/a"
        if not self.claimable:
            if min(self.n, self.n_base) < 2:
                return f"n={min(self.n, self.n_base)}, no interval"
            return f"no interval ({self.interval.note})"
        iv = self.interval
        return f"{self.ratio:.2f}x [{iv.low:.2f}, {iv.high:.2f}] (95% CI, n={self.n} vs {self.n_base})"


def ratio(c: ConditionStats, base: ConditionStats, how: Basis) -> SpeedRatio:
    """Speed of ``c`` over speed of ``base`` (> 1: ``c`` is faster), from per-run means."""
    mine, theirs = _per_run(c, how), _per_run(base, how)
    # speed ratio = base time / c time, or c tokens/s / base tokens/s
    iv = fieller_ratio(theirs, mine) if how == "time" else fieller_ratio(mine, theirs)
    return SpeedRatio(iv.ratio, iv, len(mine), len(theirs))


@dataclass(frozen=True)
class FastestClaim:
    """Which timed condition is fastest, and whether the data bound that: its ratio over every other.

    ``shown`` is true only when the 95% interval of the leader's speed ratio
    over each other timed condition lies wholly above 1. Otherwise the
    leader is only the one with the best mean, and no text may call it the
    fastest: with one run a side there is no interval, and an interval that
    holds 1 says the data cannot tell the two apart.
    """

    leader: ConditionStats
    over: tuple[tuple[ConditionStats, SpeedRatio], ...]  # the leader's speed over each other timed condition

    @property
    def shown(self) -> bool:
        return bool(self.over) and all(
            sr.claimable and sr.interval.low is not None and sr.interval.low > 1.0 for _, sr in self.over
        )

    def unbounded(self) -> list[tuple[ConditionStats, SpeedRatio]]:
        """The conditions the leader is not shown faster than, with their ratios."""
        return [(c, sr) for c, sr in self.over if not (sr.claimable and (sr.interval.low or 0.0) > 1.0)]


def fastest(conds: Sequence[ConditionStats], how: Basis) -> FastestClaim | None:
    """The condition with the best mean speed and its ratio over every other (None when none is timed)."""
    order = ranked(conds, how)
    if not order:
        return None
    lead = order[0]
    return FastestClaim(lead, tuple((c, ratio(lead, c, how)) for c in order[1:]))
