"""What one report needs, computed once: runs, condition statistics, baseline, parity, grids.

The sections (:mod:`dstui.report.sections`), the charts (:mod:`dstui.report.draw`)
and the data files (:mod:`dstui.report.files`) all read this one object, so
nothing is computed twice and no module needs another's private class.
"""

from __future__ import annotations

from typing import Any

from dstui.analysis import phases, speed
from dstui.analysis import runs as an
from dstui.analysis.checks import CheckResult, check_of, sp_check_runs
from dstui.analysis.forecast_check import forecast_vs_measured
from dstui.analysis.parity import FP32_TOLERANCE, default_tolerance
from dstui.analysis.revision_compare import Comparison, compare, samples_from_runs
from dstui.analysis.runs import ConditionStats, Parity, RunData
from dstui.report import charts
from dstui.report.found import NothingFound
from dstui.tracking import client as tracking
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
        self.speed_basis: speed.Basis = "time"  # per-step time, or tokens/s where tokens per step differ
        self.speed_ratios: dict[str, speed.SpeedRatio] = {}  # label -> speed vs the baseline, with its interval
        self.description = ""  # the spec's description (the batch parent's or experiment's MLflow note): untrusted text
        self.parents: dict[str, Any] = {}  # batch id -> its parent (batch) MLflow run, where there is one
        self.ds_configs: dict[str, dict[str, Any] | None] = {}  # run id -> the ds_config.json it ran with

    def compute(self, baseline: str | None) -> None:
        self.conds = an.condition_stats(self.runs)
        trained = [c for c in self.conds if c.kind != "verify"]
        self.verify_runs = [r for r in self.runs if r.kind == "verify"]
        try:
            self.baseline = an.choose_baseline(trained, baseline) if trained else None
        except an.ReportError as e:  # a --baseline that names no condition: nothing found (exit 3)
            raise NothingFound(str(e)) from None
        # verify-only experiments still get loss / time / memory sections from their step metrics
        self.train = trained or list(self.conds)
        if self.tolerance_basis != "given":
            self.tolerance, self.tolerance_basis = default_tolerance(trained)
        self.speed_basis = speed.basis(self.train)
        base = self.base() if self.baseline else None
        if base is not None:
            self.speed_ratios = {c.label: speed.ratio(c, base, self.speed_basis) for c in self.train if c is not base}
        if self.baseline:
            self.parity = an.loss_parity(self.train, self.baseline, self.tolerance)
            for p in self.parity:  # speed against the baseline, in the report's speed unit
                sr = self.speed_ratios.get(p.label)
                p.speedup = sr.ratio if sr is not None else None
        self.description = _description(self.parents, self.exp)
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

    def speed(self, c: ConditionStats) -> str:
        """The condition's speed figure with its unit: '9.508 ms/step' or '1.2e+04 tokens/s'."""
        v = speed.value(c, self.speed_basis)
        if v is None:
            return "n/a"
        return f"{self.t(v)} {self.unit}/step" if self.speed_basis == "time" else f"{charts.fmt_num(v)} tokens/s"

    def t(self, seconds: float | None) -> str:
        return "n/a" if seconds is None else charts.fmt_num(seconds * self.scale)

    def base(self) -> ConditionStats | None:
        """The baseline condition's statistics, if there is a baseline."""
        return next((c for c in self.train if c.label == self.baseline), None)


def _description(parents: dict[str, Any], exp: Any) -> str:
    """The spec's description: the batch parent run's note, else the experiment's ('' if none).

    Never a child run's note: that one says which run of which batch it is
    (``Run `z0-r0` of batch ...``), not what the experiment is about. With
    several batches whose descriptions differ, the experiment's note (the
    newest spec's) speaks for them.
    """
    found = list(dict.fromkeys(d for d in (parent_description(p) for p in parents.values()) if d))
    if len(found) == 1:
        return found[0]
    tags = getattr(exp, "tags", None) or {}
    return str(tags.get(tracking.NOTE, "")).strip() if isinstance(tags, dict) else ""


def parent_description(parent: Any) -> str:
    """The spec's description out of a batch parent's note (the text before dstui's own "Batch `ID` of spec" line).

    A note without that line was written or edited by a person in MLflow's
    UI: all of it is the description.
    """
    tags = getattr(getattr(parent, "data", None), "tags", None) or {}
    note = str(tags.get(tracking.NOTE, ""))
    marker = tracking.batch_note_lead(tags.get(tag_keys.BATCH, ""))
    at = note.find(marker)
    return (note[:at] if at >= 0 else note).strip()
