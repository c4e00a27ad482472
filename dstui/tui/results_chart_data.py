"""Curves for the results charts: picked runs grouped into repeats, mean and spread per step (no textual).

A group is the runs of one condition label in one batch of one experiment (its
repeats); runs picked from two batches of the same condition stay two groups,
so a before/after comparison shows two curves. Per step, the group's line is
the mean over the repeats that logged that step and its band the min and max
(drawn dimmed), as the report's loss band does. Histories come from
:func:`dstui.analysis.fetch.fetch_histories` (the results screen loaded them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dstui.core.metric_catalogue import RESULTS, shown_in, skips_warmup
from dstui.tui.chart_view import Curve

# (history key, chart title); the order of the chart pages
METRICS = tuple((m.name, m.title) for m in shown_in(RESULTS))


@dataclass
class Group:
    name: str  # what the legend says: label, with batch / experiment when the pick spans several
    experiment: str
    batch: str
    label: str
    runs: list[Any] = field(default_factory=list)  # RunData with history

    @property
    def warmup(self) -> int:
        from dstui.analysis.stats import warmup_of

        return max((warmup_of(r) for r in self.runs), default=0)


@dataclass
class Band:
    steps: list[float]
    mean: list[float]
    low: list[float]
    high: list[float]
    n: int  # repeats that logged this metric


def group_runs(runs: Sequence[Any], experiment_of: dict[str, str]) -> list[Group]:
    """Picked runs -> groups of repeats, in pick order; names say batch/experiment only when they vary."""
    groups: dict[tuple[str, str, str], Group] = {}
    for r in runs:
        exp = experiment_of.get(r.run_id, "")
        key = (exp, r.batch, r.label or r.condition)
        if key not in groups:
            groups[key] = Group("", *key)
        groups[key].runs.append(r)
    many_exps = len({k[0] for k in groups}) > 1
    many_batches = len({k[1] for k in groups}) > 1
    for g in groups.values():
        name = g.label
        if many_batches:
            name += f" @{g.batch}"
        if many_exps:
            name = f"{g.experiment}/{name}"
        g.name = name
    return list(groups.values())


def band(runs: Sequence[Any], key: str) -> Band | None:
    """Mean, min and max over the runs' values at each step (steps any run logged)."""
    import numpy as np

    steps_l, vals_l = [], []
    for r in runs:
        h = r.history.get(key)
        if h is None or not len(h[0]):
            continue
        s, v = np.asarray(h[0], dtype=float), np.asarray(h[1], dtype=float)
        ok = np.isfinite(v)
        steps_l.append(s[ok])
        vals_l.append(v[ok])
    if not steps_l:
        return None
    steps = np.concatenate(steps_l)
    vals = np.concatenate(vals_l)
    order = np.argsort(steps, kind="stable")
    steps, vals = steps[order], vals[order]
    uniq, starts = np.unique(steps, return_index=True)
    counts = np.diff(np.append(starts, len(steps)))
    mean = np.add.reduceat(vals, starts) / counts
    low = np.minimum.reduceat(vals, starts)
    high = np.maximum.reduceat(vals, starts)
    return Band(uniq.tolist(), mean.tolist(), low.tolist(), high.tolist(), len(steps_l))


def curves_for(groups: Sequence[Group], key: str) -> list[Curve]:
    """One mean line per group, plus its min/max band (dimmed) when it has 2+ repeats."""
    out: list[Curve] = []
    for i, g in enumerate(groups):
        b = band(g.runs, key)
        if b is None:
            continue
        skip = skips_warmup(key)  # warm-up timings are compile spikes; its loss and memory are real
        if b.n > 1:
            out.append(Curve(g.name, i, b.steps, b.low, raw=True, warmup=g.warmup, range_skips_warmup=skip))
            out.append(Curve(g.name, i, b.steps, b.high, raw=True, warmup=g.warmup, range_skips_warmup=skip))
        out.append(Curve(g.name, i, b.steps, b.mean, warmup=g.warmup, range_skips_warmup=skip))
    return out
