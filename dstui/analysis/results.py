"""Runs turned into results: conditions, baseline, loss verdicts, speed ratios, revision comparisons.

:func:`compute` is the one place that decides which runs are repeats of which
condition (:mod:`dstui.analysis.grouping`), which condition is the baseline,
what loss tolerance applies and how each condition compares with the
baseline. ``dstui report``, ``dstui compare`` and the TUI's Results screen all
read a :class:`Results` (loaded by :mod:`dstui.usecases.results`), so no face
can group or judge runs differently from another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dstui.analysis import speed
from dstui.analysis.grouping import assign_labels
from dstui.analysis.parity import (
    FP32_TOLERANCE,
    Parity,
    choose_baseline,
    default_tolerance,
    loss_parity,
)
from dstui.analysis.revision_compare import Comparison, compare, samples_from_runs
from dstui.analysis.rundata import RunData, distinct_tag
from dstui.analysis.stats import ConditionStats, condition_stats
from dstui.tracking import tags as tag_keys


@dataclass
class Results:
    """What a set of runs says, computed once for every face."""

    experiment: str = ""
    exp: Any = None  # the MLflow experiment
    uri: str = ""  # the tracking store it came from
    method: str = ""  # how the metric histories were read (fetch.fetch_histories)
    batch: str | None = None  # the one batch asked for, if any
    runs: list[RunData] = field(default_factory=list)  # every run found, never-started ones included
    started: list[RunData] = field(default_factory=list)  # the runs that were launched: repeats of conditions
    not_started: list[RunData] = field(default_factory=list)  # cancelled before start, skipped, still queued
    notes: list[str] = field(default_factory=list)  # conditions split or pooled, and why
    batches: list[str] = field(default_factory=list)
    parents: dict[str, Any] = field(default_factory=dict)  # batch id -> its parent (batch) MLflow run
    conds: list[ConditionStats] = field(default_factory=list)
    train: list[ConditionStats] = field(default_factory=list)  # the conditions speed and loss are judged on
    verify_runs: list[RunData] = field(default_factory=list)
    baseline: str | None = None
    tolerance: float = FP32_TOLERANCE
    tolerance_basis: str = ""  # how the loss tolerance was chosen ("given" when the caller gave it)
    parity: list[Parity] = field(default_factory=list)
    speed_basis: speed.Basis = "time"  # per-step time, or tokens/s where tokens per step differ
    speed_ratios: dict[str, speed.SpeedRatio] = field(default_factory=dict)  # label -> speed vs the baseline
    fastest: speed.FastestClaim | None = None
    base_revision: str | None = None
    revisions: list[Comparison] = field(default_factory=list)
    include_overlapped: bool = False  # timings taken beside other runs were kept (report --include-overlapped)

    def base(self) -> ConditionStats | None:
        """The baseline condition's statistics, if there is a baseline."""
        return next((c for c in self.train if c.label == self.baseline), None)

    def condition(self, label: str) -> ConditionStats | None:
        return next((c for c in self.conds if c.label == label), None)


def compute(runs: Sequence[RunData], *, baseline: str | None = None, tolerance: float | None = None) -> Results:
    """Group the runs (stats already computed) and judge every condition against the baseline.

    Raises :class:`~dstui.analysis.rundata.ReportError` for a ``baseline``
    that names no condition.
    """
    res = Results(runs=list(runs))
    res.notes = assign_labels(res.runs)
    res.started = [r for r in res.runs if r.started]
    res.not_started = [r for r in res.runs if not r.started]
    res.batches = distinct_tag(res.runs, tag_keys.BATCH)
    res.conds = condition_stats(res.started)
    trained = [c for c in res.conds if c.kind != "verify"]
    res.verify_runs = [r for r in res.started if r.kind == "verify"]
    res.baseline = choose_baseline(trained, baseline) if trained else None
    # verify-only experiments still get loss / time / memory figures from their step metrics
    res.train = trained or list(res.conds)
    if tolerance is not None:
        res.tolerance, res.tolerance_basis = tolerance, "given"
    else:
        res.tolerance, res.tolerance_basis = default_tolerance(trained)
    res.speed_basis = speed.basis(res.train)
    res.fastest = speed.fastest(res.train, res.speed_basis)
    base = res.base()
    if base is not None:
        res.speed_ratios = {c.label: speed.ratio(c, base, res.speed_basis) for c in res.train if c is not base}
        res.parity = loss_parity(res.train, base.label, res.tolerance)
        for p in res.parity:  # speed against the baseline, in the report's speed unit
            sr = res.speed_ratios.get(p.label)
            p.speedup = sr.ratio if sr is not None else None
    _compare_revisions(res, trained)
    return res


def _compare_revisions(res: Results, trained: list[ConditionStats]) -> None:
    """Revision vs baseline revision per condition: the numbers ``dstui compare`` prints."""
    runs = [r for c in trained for r in c.runs]
    revs = list(dict.fromkeys(r.revision for r in runs))
    if len(revs) < 2:
        return
    base = res.base()
    res.base_revision = base.revision if base is not None else revs[0]
    res.revisions = compare(samples_from_runs(runs), res.base_revision, loss_tol=res.tolerance)
