"""Rows for the results screen, from :mod:`dstui.usecases.results` (no textual).

Runs in a thread worker: mlflow, numpy and pandas are imported there, never
on the TUI's start path. The figures and the conditions are the report's
(same loader, same grouping, same warm-up rule), so what the TUI shows is
what the exported report says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ResultRow:
    label: str  # condition (with @revision when several)
    condition: str
    revision: str
    batch: str
    runs: str  # "3/3" usable of total, or the run's state
    status: str
    iter_mean: float | None
    iter_std: float | None
    tokens_per_s: float | None
    mem_peak: float | None
    final_loss: float | None
    reason: str = ""
    run_name: str = ""
    run_means: list[float] = field(default_factory=list)  # per-run mean iteration times (finished runs)
    run_ids: list[str] = field(default_factory=list)  # the MLflow runs behind the row (one for a run row)
    experiment: str = ""
    search_text: str = ""  # lower-case "name batch status key=value ..." of params and tags: what / filters on


@dataclass
class Results:
    experiment: str
    experiments: list[str]
    batches: list[str]
    conditions: list[ResultRow] = field(default_factory=list)
    runs: list[ResultRow] = field(default_factory=list)
    tracking_uri: str = ""
    default_baseline: str | None = None
    run_data: dict[str, Any] = field(default_factory=dict)  # run id -> RunData with its history (charts)
    notes: list[str] = field(default_factory=list)  # conditions split or pooled, and why (the report's notes)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def search_text(runs: Any, *extra: str) -> str:
    """What the filter matches against: names, batch, status and every param and tag as key=value."""
    parts = [*extra]
    for r in runs:
        parts += [r.run_name, r.batch, r.status, r.condition, r.revision]
        parts += [f"{k}={v}" for k, v in r.params.items()]
        parts += [f"{k.removeprefix('dstui.')}={v}" for k, v in r.tags.items() if not k.startswith("mlflow.")]
    return " ".join(p for p in parts if p).lower()


def load(experiment: str | None, batch: str | None, *, tracking_uri: str | None = None) -> Results:
    """The screen's rows from :func:`dstui.usecases.results.browse` (the loader of reports and compare too)."""
    from dstui.usecases.results import browse

    found = browse(experiment, batch, tracking_uri=tracking_uri)
    out = Results(found.experiment, found.experiments, found.batches, tracking_uri=found.uri)
    res = found.results
    if res is None:
        return out
    out.conditions = [_condition_row(cs, found.experiment) for cs in res.conds]
    out.run_data = {r.run_id: r for r in res.runs}
    out.runs = [_run_row(r, found.experiment) for r in res.runs]
    out.default_baseline = res.baseline or (res.conds[0].label if res.conds else None)
    out.notes = list(res.notes)
    return out


def _condition_row(cs: Any, experiment: str) -> ResultRow:
    """One condition: its started runs' figures (runs that never started are in no condition)."""
    return ResultRow(
        label=cs.label, condition=cs.condition, revision=cs.revision, batch="",
        runs=f"{cs.n_usable}/{cs.n_runs}", status=cs.statuses,
        iter_mean=_num(cs.iter_time_mean), iter_std=_num(cs.iter_time_std),
        tokens_per_s=_num(cs.tokens_per_s_mean), mem_peak=_num(cs.mem_peak_max),
        final_loss=_num(cs.final_loss), reason="; ".join(cs.reasons),
        run_means=[m for r in cs.runs if r.status == "done" and (m := _num(r.stats.get("iter_time_mean"))) is not None],
        run_ids=[r.run_id for r in cs.runs], experiment=experiment,
        search_text=search_text(cs.runs, cs.label, cs.statuses),
    )  # fmt: skip


def _run_row(r: Any, experiment: str) -> ResultRow:
    st = r.stats
    return ResultRow(
        label=r.label, condition=r.condition, revision=r.revision, batch=r.batch,
        runs=r.status, status=r.status, iter_mean=_num(st.get("iter_time_mean")),
        iter_std=_num(st.get("iter_time_std")), tokens_per_s=_num(st.get("tokens_per_s_mean")),
        mem_peak=_num(st.get("mem_peak_max")), final_loss=_num(st.get("final_loss")),
        reason=r.reason, run_name=r.run_name, run_ids=[r.run_id], experiment=experiment,
        search_text=search_text([r], r.label, r.reason),
    )  # fmt: skip
