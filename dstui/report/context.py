"""What one report needs, computed once: runs, condition statistics, baseline, parity, grids.

The sections (:mod:`dstui.report.sections`), the charts (:mod:`dstui.report.draw`)
and the data files (:mod:`dstui.report.files`) all read this one object, so
nothing is computed twice and no module needs another's private class.
"""

from __future__ import annotations

from typing import Any

from dstui.analysis import phases
from dstui.analysis import runs as an
from dstui.analysis.checks import CheckResult, check_of, sp_check_runs
from dstui.analysis.forecast_check import forecast_vs_measured
from dstui.analysis.parity import FP32_TOLERANCE, default_tolerance
from dstui.analysis.revision_compare import Comparison, compare, samples_from_runs
from dstui.analysis.runs import ConditionStats, Parity, RunData
from dstui.report import charts
from dstui.tracking import tags as tag_keys

DEFAULT_TOLERANCE = FP32_TOLERANCE


class ReportContext:
    """Everything one report needs, computed once, rendered to several files."""

    def __init__(
        self,
        experiment: str,
        exp: Any,
        batch: str | None,
        uri: str,
        tolerance: float | None,
        method: str,
        runs: list[RunData],
    ) -> None:
        self.experiment = experiment
        self.exp = exp
        self.batch = batch
        self.uri = uri
        self.tolerance = tolerance if tolerance is not None else DEFAULT_TOLERANCE
        self.tolerance_basis = "given" if tolerance is not None else ""
        self.method = method
        self.runs = runs
        self.batches = an.distinct_tag(runs, tag_keys.BATCH)
        self.conds: list[ConditionStats] = []
        self.train: list[ConditionStats] = []
        self.verify_runs: list[RunData] = []
        self.baseline: str | None = None
        self.parity: list[Parity] = []
        self.grid: dict[str, dict[str, Any]] | None = None
        self.images: dict[str, str] = {}
        self.commands: dict[str, str] = {}
        self.parent_run_id: str | None = None
        self.unit, self.scale = "s", 1.0
        self.checks: list[CheckResult] = []
        self.sp_checks: list[CheckResult] = []
        self.base_revision: str | None = None
        self.revisions: list[Comparison] = []
        self.times: Any = None  # DataFrame: seconds per segment, one row per run with a breakdown
        self.step_shares: dict[str, tuple[float, float, float]] = {}
        self.memory_forecast: Any = None  # DataFrame: forecast vs measured peak per condition
        self.forecast_missing = ""  # the module a forecast needed but could not import

    def compute(self, baseline: str | None) -> None:
        self.conds = an.condition_stats(self.runs)
        trained = [c for c in self.conds if c.kind != "verify"]
        self.verify_runs = [r for r in self.runs if r.kind == "verify"]
        self.baseline = an.choose_baseline(trained, baseline) if trained else None
        # verify-only experiments still get loss / time / memory sections from their step metrics
        self.train = trained or list(self.conds)
        if self.tolerance_basis != "given":
            self.tolerance, self.tolerance_basis = default_tolerance(trained)
        if self.baseline:
            self.parity = an.loss_parity(self.train, self.baseline, self.tolerance)
        self.checks = [check_of(r) for r in self.verify_runs]
        self.sp_checks = sp_check_runs(self.runs)
        self._compare_revisions(trained)
        if an.wants_grid(self.runs):
            self.grid = an.grids(self.runs)
        self.unit, self.scale = charts.time_unit([c.iter_time_mean for c in self.train if c.iter_time_mean])
        self.times = phases.time_table(self.runs)
        self.step_shares = phases.step_share_by_batch(self.runs)
        try:
            self.memory_forecast = forecast_vs_measured(self.runs)
        except ImportError as e:  # DeepSpeed's estimators: the optional training stack (dstui[train])
            self.forecast_missing = f"{e.name or e}"

    def _compare_revisions(self, trained: list[ConditionStats]) -> None:
        """Revision vs baseline revision per condition: the same numbers as ``dstui compare``."""
        runs = [r for c in trained for r in c.runs]
        revs = list(dict.fromkeys(r.revision for r in runs))
        if len(revs) < 2:
            return
        base = self.base()
        self.base_revision = base.revision if base is not None else revs[0]
        self.revisions = compare(samples_from_runs(runs), self.base_revision, loss_tol=self.tolerance)

    def t(self, seconds: float | None) -> str:
        return "n/a" if seconds is None else charts.fmt_num(seconds * self.scale)

    def base(self) -> ConditionStats | None:
        """The baseline condition's statistics, if there is a baseline."""
        return next((c for c in self.train if c.label == self.baseline), None)
