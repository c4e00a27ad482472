"""The metrics of a step record dstui shows: one row each (name, title, unit, scale, warm-up rule, where shown).

Every face reads this table instead of a list of its own: the Live screen's series
(``LIVE``), the Results screen's chart pages (``RESULTS``, in this order), the last
step's values kept in status.json for ``dstui status`` and ``--json`` (``STATUS``),
the experiment's saved chart view in MLflow (``MLFLOW_VIEW``, under the names
:func:`dstui.tracking.metric_names.mlflow_key` gives them), the per-run statistics
of reports, ``dstui compare`` and bisect (``STATS``), the metrics ``dstui bisect`` judges by
rules of its own (``BISECT``, besides any recorded field). A run may record any other
metric; it reaches MLflow under its own name (:mod:`dstui.core.metric_names`), it is
just not drawn or summarised by name.

**The warm-up rule, one for every face.** The first ``warmup_steps`` optimizer steps
include compilation, allocator growth and NCCL set-up: a timing or rate of theirs is a
spike, not the run's pace. So a metric with ``skips_warmup`` leaves them out of its
statistics and of a chart's y-range (the Live and Results charts alike); loss and
memory do not (the warm-up's loss is real, and so is the memory it took). Warm-up
steps are counted from the first step a run can log (:func:`first_counted_step`),
never from the first it did log, so ``log_interval`` does not move the line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# where a metric is shown
LIVE, RESULTS, STATUS, MLFLOW_VIEW, STATS, BISECT = "live", "results", "status", "mlflow_view", "stats", "bisect"
# how a face chooses the unit it shows a value in
TIME = "time"  # seconds in the record; ms below 1 s
BYTES = "bytes"  # bytes in the record; the largest binary unit that fits (GiB in MLflow)
PLAIN = "plain"  # shown as recorded


@dataclass(frozen=True)
class Metric:
    name: str  # the step record's field, and the history key readers get back from MLflow
    title: str  # a chart's or a column's name
    unit: str  # the unit the record holds it in ("" for a pure number)
    scale: str  # TIME, BYTES or PLAIN
    skips_warmup: bool  # warm-up steps left out of its statistics and of a chart's y-range
    smoothed: bool = False  # the Live screen draws an exponential moving average beside the raw steps
    shown: frozenset[str] = frozenset()


def _m(name: str, title: str, unit: str, scale: str, skips: bool, *shown: str, smoothed: bool = False) -> Metric:
    return Metric(name, title, unit, scale, skips, smoothed, frozenset(shown))


CATALOGUE: tuple[Metric, ...] = (
    _m("loss", "loss", "", PLAIN, False, LIVE, RESULTS, STATUS, MLFLOW_VIEW, STATS, BISECT, smoothed=True),
    _m("iter_time", "iteration time", "s", TIME, True, LIVE, RESULTS, STATUS, MLFLOW_VIEW, STATS, BISECT, smoothed=True),
    _m("mem_peak", "peak memory", "bytes", BYTES, False, LIVE, RESULTS, STATUS, MLFLOW_VIEW, STATS, BISECT),
    _m("tokens_per_s", "tokens/s", "tokens/s", PLAIN, True, LIVE, RESULTS, STATUS, MLFLOW_VIEW, STATS),
    _m("mem_alloc", "allocated memory", "bytes", BYTES, False, LIVE, MLFLOW_VIEW, STATS),
    _m("lr", "learning rate", "", PLAIN, False, MLFLOW_VIEW),
    _m("grad_norm", "gradient norm", "", PLAIN, False, MLFLOW_VIEW),
    _m("tflops_per_gpu", "TFLOP/s per GPU", "TFLOP/s", PLAIN, True, MLFLOW_VIEW, STATS),
    _m("mfu", "MFU", "", PLAIN, True, MLFLOW_VIEW, STATS),
)
BY_NAME = {m.name: m for m in CATALOGUE}


def shown_in(place: str) -> tuple[Metric, ...]:
    """The metrics a place shows, in the catalogue's order."""
    return tuple(m for m in CATALOGUE if place in m.shown)


def names_in(place: str) -> tuple[str, ...]:
    return tuple(m.name for m in shown_in(place))


STATUS_KEYS = names_in(STATUS)  # the last step's values status.json keeps (``last``)


def skips_warmup(name: str) -> bool:
    """Whether a metric's warm-up steps are left out (unknown metrics: kept, as loss is)."""
    m = BY_NAME.get(name)
    return m is not None and m.skips_warmup


def warmup_count(value: Any) -> int | None:
    """A warm-up step count as settings, params or a summary record hold it (``warmup_steps``); None
    for anything but a finite non-negative number (the caller then asks elsewhere, or takes 0): a
    foreign or damaged folder's runs are never cut short."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return int(value)


def first_counted_step(first_step: float, warmup: int) -> float:
    """The first step after warm-up. Runners count steps from 1 (dstui's) or from 0 (some
    programs); with ``log_interval`` > 1 the first logged step may already be past warm-up."""
    return (0 if first_step == 0 else 1) + warmup
