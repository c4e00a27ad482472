"""Rows for the results screen, from MLflow through :mod:`dstui.analysis.runs` (no textual).

Runs in a thread worker: mlflow, numpy and pandas are imported here, never
on the TUI's start path. The figures are the report's (same module, same
warm-up rule), so what the TUI shows is what the exported report says.
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
    from dstui.analysis import runs as analysis
    from dstui.core import paths
    from dstui.tracking import client as tracking

    uri = tracking_uri or paths.tracking_uri()
    c = tracking.client(uri)
    exps = sorted(
        (e for e in c.search_experiments() if e.name != "Default"),
        key=lambda e: e.last_update_time or e.creation_time or 0,
        reverse=True,
    )
    names = [e.name for e in exps]
    if not names:
        return Results("", [], [], tracking_uri=uri)
    if experiment not in names:
        experiment = names[0]
    try:
        _, runs = analysis.fetch_runs(c, experiment)
    except analysis.ReportError:
        return Results(experiment, names, [], tracking_uri=uri)
    batches = sorted({r.batch for r in runs if r.batch}, reverse=True)
    if batch:
        runs = [r for r in runs if r.batch == batch]
    analysis.fetch_histories(c, uri, runs)
    for r in runs:
        r.stats = analysis.compute_run_stats(r)
    analysis.assign_labels(runs)
    conds = analysis.condition_stats(runs)
    out = Results(experiment, names, batches, tracking_uri=uri)
    for cs in conds:
        out.conditions.append(
            ResultRow(
                label=cs.label, condition=cs.condition, revision=cs.revision, batch="",
                runs=f"{cs.n_usable}/{cs.n_runs}", status=cs.statuses,
                iter_mean=_num(cs.iter_time_mean), iter_std=_num(cs.iter_time_std),
                tokens_per_s=_num(cs.tokens_per_s_mean), mem_peak=_num(cs.mem_peak_max),
                final_loss=_num(cs.final_loss), reason="; ".join(cs.reasons),
                run_means=[m for r in cs.runs if r.status == "done" and (m := _num(r.stats.get("iter_time_mean"))) is not None],
                run_ids=[r.run_id for r in cs.runs], experiment=experiment,
                search_text=search_text(cs.runs, cs.label, cs.statuses),
            )
        )  # fmt: skip
    out.run_data = {r.run_id: r for r in runs}
    for r in runs:
        st = r.stats
        out.runs.append(
            ResultRow(
                label=r.label, condition=r.condition, revision=r.revision, batch=r.batch,
                runs=r.status, status=r.status, iter_mean=_num(st.get("iter_time_mean")),
                iter_std=_num(st.get("iter_time_std")), tokens_per_s=_num(st.get("tokens_per_s_mean")),
                mem_peak=_num(st.get("mem_peak_max")), final_loss=_num(st.get("final_loss")),
                reason=r.reason, run_name=r.run_name, run_ids=[r.run_id], experiment=experiment,
                search_text=search_text([r], r.label, r.reason),
            )
        )  # fmt: skip
    try:
        out.default_baseline = analysis.choose_baseline(conds, None)
    except Exception:
        out.default_baseline = conds[0].label if conds else None
    return out
