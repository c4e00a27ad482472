"""When a probe has measured enough, and what it measured: pure functions of its step times.

A probe skips its warm-up steps, then runs until the 95% interval of its mean
step time is tight enough to rank it (``precision`` of the mean), or until the
interval already lies wholly above the best measured one (it cannot win: more
steps would only say by how much), or until its steps or its time box run out.
The interval is Student's t over the timed steps: few steps give a wide one,
which is what keeps a noisy probe running.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

OUTLIER_FACTOR = 3.0  # a timed step over 3x the median is a stall of the machine, not the configuration's pace
PRECISE = "precise"  # the interval is tight enough
SLOWER = "slower"  # the interval lies above the best's: it cannot win


@dataclass(frozen=True)
class StepTime:
    """The mean step time of the timed steps and the half-width of its 95% interval (inf below 2 steps)."""

    mean: float
    half: float
    steps: int
    outliers: int = 0  # timed steps left out as stalls (> OUTLIER_FACTOR x the median)

    @property
    def rel_half(self) -> float:
        return self.half / self.mean if self.mean > 0 else math.inf

    @property
    def rel_sd(self) -> float:
        """Standard error of the mean, relative (what the time model weighs an observation by)."""
        return self.rel_half / 1.96 if math.isfinite(self.rel_half) else 0.5

    @property
    def low(self) -> float:
        return self.mean - self.half

    @property
    def high(self) -> float:
        return self.mean + self.half


def t_quantile(dof: int, level: float = 0.975) -> float:
    from scipy.stats import t

    return float(t.ppf(level, dof))


def step_time(times: Sequence[float], warmup: int) -> StepTime | None:
    """The timed steps' mean and 95% interval; None before the first timed step.

    Steps slower than :data:`OUTLIER_FACTOR` x the median are left out (and
    counted), the report's outlier rule: on a shared machine one step can wait
    seconds for a core, and a mean that carries it ranks the machine's load,
    not the configuration.
    """
    every = [float(t) for t in list(times)[warmup:] if t is not None and math.isfinite(t) and t > 0]
    if not every:
        return None
    limit = OUTLIER_FACTOR * statistics.median(every)
    timed = [t for t in every if t <= limit]
    mean = statistics.fmean(timed)
    if len(timed) < 2:
        return StepTime(mean, math.inf, 1, len(every) - len(timed))
    half = t_quantile(len(timed) - 1) * statistics.stdev(timed) / math.sqrt(len(timed))
    return StepTime(mean, half, len(timed), len(every) - len(timed))


def verdict(times: Sequence[float], *, warmup: int, min_steps: int, precision: float, best: StepTime | None) -> str | None:
    """Why the probe may stop now (:data:`PRECISE`, :data:`SLOWER`), or None: keep measuring."""
    st = step_time(times, warmup)
    if st is None or st.steps < min_steps:
        return None
    if st.rel_half <= precision:
        return PRECISE
    if best is not None and st.low > best.high:
        return SLOWER
    return None
