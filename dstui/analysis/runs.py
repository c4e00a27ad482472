"""Figures for reports, computed from what MLflow holds.

Everything a report shows is computed here, from MLflow runs laid out as
``docs/ARCHITECTURE.md`` describes (child runs tagged ``dstui.role=run``), so
that live, old, imported and team-server runs are treated alike. Charts
(:mod:`dstui.report.charts`) and markdown (:mod:`dstui.report.markdown`) only format these
numbers; the tests check them against figures computed independently.

Definitions (the report repeats them so a reader does not have to guess):

* a *condition* is the runs that ran with the same settings (:mod:`~dstui.analysis.grouping`):
  runs that never started are in none, and one spec condition run with other settings in
  another batch (other ``steps``, another DeepSpeed) is a condition of its own;
* a *step* is one optimizer step (``grad_accum`` micro-batches);
* per-run statistics exclude the first ``warmup_steps`` optimizer steps
  (param ``warmup_steps``), because the first steps include compilation,
  allocator growth and NCCL set-up;
* a condition's iteration time is the mean over the post-warm-up iterations
  of all its usable repeats, its error bar the sample standard deviation
  (n-1) of those same iterations;
* throughput (tokens/s), TFLOP/s and MFU are total work / total time over
  those same iterations: the harmonic mean of the per-step rates (tokens per
  step / mean iteration time when every step does the same work), never the
  arithmetic mean of rates, which overstates them when step times vary;
* an iteration is an *outlier* when it takes more than ``OUTLIER_FACTOR``
  times the median post-warm-up iteration of its run;
* loss parity compares per-step mean losses (mean over repeats) on the steps
  both conditions logged, warm-up included (loss is deterministic from step
  one): PASS when the largest absolute difference is within the tolerance.

pandas and mlflow are imported inside functions: ``dstui`` must import fast.

This module is the package's front door: it re-exports the rooms
(:mod:`~dstui.analysis.rundata` records, :mod:`~dstui.analysis.fetch` MLflow reading,
:mod:`~dstui.analysis.stats` statistics, :mod:`~dstui.analysis.parity`,
:mod:`~dstui.analysis.grids`) so callers write ``from dstui.analysis import runs as an``.
"""

from __future__ import annotations

from dstui.analysis.fetch import fetch_histories, fetch_runs, find_batch_parent
from dstui.analysis.grids import grids, level_of, pareto, r_state, wants_grid
from dstui.analysis.grouping import assign_labels
from dstui.analysis.identity import common_and_varying
from dstui.analysis.parity import Parity, choose_baseline, loss_parity
from dstui.analysis.rundata import (
    FAILED_STATES,
    GB,
    KNOWN_STEP_KEYS,
    OUTLIER_FACTOR,
    SUMMARY_PREFIX,
    SYSTEM_PREFIX,
    USABLE_STATES,
    Progress,
    ReportError,
    RunData,
    distinct_tag,
    parse_value,
    run_from_mlflow,
    safe_name,
)
from dstui.analysis.stats import (
    ConditionStats,
    compute_run_stats,
    condition_stats,
    loss_band,
    post_warmup_mask,
    tokens_per_step,
    warmup_of,
)

__all__ = [
    "FAILED_STATES", "GB", "KNOWN_STEP_KEYS", "OUTLIER_FACTOR", "SUMMARY_PREFIX", "SYSTEM_PREFIX", "USABLE_STATES",
    "ConditionStats", "Parity", "Progress", "ReportError", "RunData", "assign_labels", "choose_baseline",
    "common_and_varying", "compute_run_stats", "condition_stats", "distinct_tag", "fetch_histories", "fetch_runs",
    "find_batch_parent", "grids", "level_of", "loss_band", "loss_parity", "pareto", "parse_value", "post_warmup_mask",
    "r_state", "run_from_mlflow", "safe_name", "tokens_per_step", "wants_grid", "warmup_of",
]
