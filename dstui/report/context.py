"""What one report needs, computed once: the loaded results plus checks, grids, time and memory tables.

The results (runs, conditions, baseline, loss verdicts, speed ratios) are
:class:`~dstui.analysis.results.Results`, loaded by :mod:`dstui.usecases.results`
exactly as ``dstui compare`` and the TUI load them; this context adds what only
a report shows. The sections (:mod:`dstui.report.sections`), the charts
(:mod:`dstui.report.draw`) and the data files (:mod:`dstui.report.files`) all
read this one object, so nothing is computed twice and no module needs
another's private class.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from dstui.analysis import phases, speed
from dstui.analysis.checks import CheckResult, check_of, sp_check_runs
from dstui.analysis.forecast_check import forecast_vs_measured
from dstui.analysis.grids import grids, wants_grid
from dstui.analysis.results import Results
from dstui.analysis.sequence_parallel import SpRow, sp_rows
from dstui.analysis.stats import ConditionStats
from dstui.analysis.time_check import time_vs_measured
from dstui.analysis.tuning import from_parents as tuning_of
from dstui.report import charts
from dstui.tracking import layout
from dstui.tracking import tags as tag_keys


@dataclass
class ReportContext(Results):
    """Everything one report needs, computed once, rendered to several files."""

    grid: dict[str, dict[str, Any]] | None = None
    images: dict[str, str] = field(default_factory=dict)
    commands: dict[str, str] = field(default_factory=dict)
    logged_to: dict[str, str] = field(default_factory=dict)  # batch id -> parent run id the report is logged to
    unit: str = "s"
    scale: float = 1.0
    checks: list[CheckResult] = field(default_factory=list)
    sp_checks: list[CheckResult] = field(default_factory=list)
    sp_rows: list[SpRow] = field(default_factory=list)  # sequence-parallel runs beside their no-SP run
    times: Any = None  # DataFrame: seconds per segment, one row per run with a breakdown
    step_shares: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    memory_forecast: Any = None  # DataFrame: forecast vs measured peak per condition
    forecast_missing: str = ""  # the module a forecast needed but could not import
    description: str = ""  # the spec's description (the batch parent's or experiment's MLflow note): untrusted text
    ds_configs: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # run id -> its ds_config.json
    time_forecast: Any = None  # DataFrame: predicted (leave one condition out) vs measured step time
    tuning: Any = None  # TuneSummary of a `dstui tune` search among the batches, else None

    @classmethod
    def of(cls, res: Results) -> ReportContext:
        """The report's context over loaded results, its own figures computed."""
        ctx = cls(**{f.name: getattr(res, f.name) for f in fields(Results)})
        ctx.description = _description(ctx.parents, ctx.exp)
        ctx.checks = [check_of(r) for r in ctx.verify_runs]
        ctx.sp_checks = sp_check_runs(ctx.started)
        ctx.sp_rows = sp_rows(ctx.started, ctx.sp_checks)
        if wants_grid(ctx.started):
            ctx.grid = grids(ctx.started)
        ctx.unit, ctx.scale = charts.time_unit([c.iter_time_mean for c in ctx.train if c.iter_time_mean])
        ctx.times = phases.time_table(ctx.started)
        ctx.step_shares = phases.step_share_by_batch(ctx.started)
        try:
            # a condition none of whose runs started (skipped: predicted OOM) keeps its forecast row: it says why
            names = {r.condition for r in ctx.started}
            ctx.memory_forecast = forecast_vs_measured([r for r in ctx.runs if r.started or r.condition not in names])
        except ImportError as e:  # DeepSpeed's estimators: the optional training stack (dstui[train])
            ctx.forecast_missing = f"{e.name or e}"
        ctx.time_forecast = time_vs_measured(ctx.started)
        ctx.tuning = tuning_of(ctx.parents)
        return ctx

    def speed(self, c: ConditionStats) -> str:
        """The condition's speed figure with its unit: '9.508 ms/step' or '1.2e+04 tokens/s'."""
        v = speed.value(c, self.speed_basis)
        if v is None:
            return "n/a"
        return f"{self.t(v)} {self.unit}/step" if self.speed_basis == "time" else f"{charts.fmt_num(v)} tokens/s"

    def t(self, seconds: float | None) -> str:
        return "n/a" if seconds is None else charts.fmt_num(seconds * self.scale)

    @property
    def on_cpu(self) -> bool:
        """Every timed run ran on CPU: its memory figures are the process's RSS, not tensor memory."""
        devices = {r.tags.get(tag_keys.DEVICE, "") for c in self.train for r in c.runs if r.usable}
        return devices == {"cpu"}


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
    return str(tags.get(tag_keys.DESCRIPTION, "")).strip() if isinstance(tags, dict) else ""


def parent_description(parent: Any) -> str:
    """The spec's description out of a batch parent's note (the text before dstui's own "Batch `ID` of spec" line).

    A note without that line was written or edited by a person in MLflow's
    UI: all of it is the description.
    """
    tags = getattr(getattr(parent, "data", None), "tags", None) or {}
    note = str(tags.get(tag_keys.DESCRIPTION, ""))
    marker = layout.batch_description_lead(tags.get(tag_keys.BATCH, ""))
    at = note.find(marker)
    return (note[:at] if at >= 0 else note).strip()
