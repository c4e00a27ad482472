"""The report's data files: runs.csv, conditions.csv, the grid CSVs and data.json.

Kept apart from the markdown (:mod:`dstui.report.markdown`) because they are the
machine-readable record of the same figures: every run with its statistics,
settings and full per-step histories, for readers other than people.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dstui.analysis.parity import Parity
from dstui.analysis.rundata import GB, OUTLIER_FACTOR, RunData
from dstui.analysis.stats import ConditionStats
from dstui.core.credential_text import strip_credentials

if TYPE_CHECKING:  # pragma: no cover
    from dstui.report.context import ReportContext

_STAT_COLUMNS = (
    "points",
    "warmup_steps",
    "iter_points",
    "iter_time_mean",
    "iter_time_std",
    "iter_time_median",
    "iter_time_min",
    "iter_time_max",
    "tokens_per_s_mean",
    "tflops_per_gpu_mean",
    "mfu_mean",
    "mem_peak_max",
    "mem_alloc_max",
    "final_loss",
    "final_step",
    "tokens_per_step",
)


def write_runs_csv(path: Path, runs: Sequence[RunData]) -> None:
    param_keys = sorted({k for r in runs for k in r.params if not k.startswith("ds.")})
    head = ["run_id", "run_name", "label", "condition", "revision", "repeat", "kind", "status", "oom", "reason", "batch"]
    head += list(_STAT_COLUMNS) + ["mem_peak_gb", "outliers"] + [f"param.{k}" for k in param_keys]
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(head)
        for r in runs:
            st = r.stats
            row: list[Any] = [r.run_id, r.run_name, r.label, r.condition, r.revision, r.repeat, r.kind, r.status, r.oom, r.reason, r.batch]
            row += [_csv(st.get(k)) for k in _STAT_COLUMNS]
            mp = st.get("mem_peak_max")
            row += [_csv(mp / GB if mp is not None else None), len(st.get("outlier_steps", []))]
            row += [r.params.get(k, "") for k in param_keys]
            w.writerow(row)


def write_conditions_csv(path: Path, conds: Sequence[ConditionStats], parity: Sequence[Parity]) -> None:
    verdicts = {p.label: p for p in parity}
    rows = []
    for c in conds:
        row = c.as_row()
        p = verdicts.get(c.label)
        row["parity_max_abs_diff"] = p.max_abs_diff if p else None
        row["parity_verdict"] = p.verdict if p else ""
        row["speedup_vs_baseline"] = p.speedup if p else None
        rows.append(row)
    if not rows:
        return
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        for row in rows:
            w.writerow({k: _csv(v) for k, v in row.items()})


def write_grid_csv(path: Path, frames: dict[str, Any]) -> None:
    """Seed 004's layout, tidy: level, model, then one column per micro batch."""
    cols: list[str] = []
    for frame in frames.values():
        for c in frame.columns:
            if c not in cols:
                cols.append(c)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["level", "model", *cols])
        for level, frame in frames.items():
            for model in frame.index:
                w.writerow([level, model, *[cell(frame.loc[model].get(c, "")) for c in cols]])


def write_json(path: Path, ctx: ReportContext) -> None:
    import numpy as np

    def series(steps: Any, values: Any) -> dict[str, Any]:
        if np.isnan(values).any():
            vals: list[Any] = [None if math.isnan(v) else v for v in values.tolist()]
        else:
            vals = values.tolist()
        return {"step": steps.tolist(), "value": vals}

    runs = []
    for r in ctx.runs:
        runs.append({
            "run_id": r.run_id,
            "run_name": r.run_name,
            "label": r.label,
            "condition": r.condition,
            "started": r.started,
            "revision": r.revision,
            "repeat": r.repeat,
            "kind": r.kind,
            "status": r.status,
            "oom": r.oom,
            "reason": r.reason,
            "mlflow_status": r.mlflow_status,
            "params": r.params,
            "tags": r.tags,
            "metrics": _clean(r.metrics),
            "stats": _clean(r.stats),
            "command": ctx.commands.get(r.run_id, ""),
            "history": {k: series(s, v) for k, (s, v) in sorted(r.history.items())},
        })
    doc = {
        "experiment": ctx.experiment,
        "experiment_id": ctx.exp.experiment_id,
        "batch": ctx.batch,
        "batches": ctx.batches,
        "tracking_uri": strip_credentials(ctx.uri),
        "generated": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "definitions": {
            "iteration": "one optimizer step (grad_accum micro-batches)",
            "warmup": "first warmup_steps optimizer steps of each run excluded from statistics",
            "iter_time_std": "sample standard deviation (n-1) over pooled post-warm-up iterations",
            "outlier": f"post-warm-up iteration > {OUTLIER_FACTOR:g} x run median",
            "parity": "max over common steps of |mean loss - baseline mean loss| <= tolerance",
            "memory_unit": "bytes in histories and stats; GiB = 2^30 bytes in tables (columns *_gb are GiB)",
        },
        "baseline": ctx.baseline,
        "tolerance": ctx.tolerance,
        "tolerance_basis": ctx.tolerance_basis,
        "notes": ctx.notes,
        "logged_to": ctx.logged_to,
        "conditions": [_clean({**c.as_row(), "settings": c.settings, "run_ids": [r.run_id for r in c.runs]})
                       for c in ctx.conds],
        "parity": [_clean(p.as_row()) for p in ctx.parity],
        "grids": {
            name: {level: frame.reset_index().to_dict(orient="records") for level, frame in levels.items()}
            for name, levels in (ctx.grid or {}).items()
        },
        "time_breakdown": _clean(_times(ctx)),
        "memory_forecast": _clean([] if ctx.memory_forecast is None else ctx.memory_forecast.to_dict(orient="records")),
        "runs": runs,
    }
    # one json.dumps then one write: json.dump streams thousands of small chunks
    path.write_text(json.dumps(doc, allow_nan=False, default=str), encoding="utf-8")


def _times(ctx: ReportContext) -> dict[str, Any]:
    """Seconds per segment per run (the report's table) and each batch's step share."""
    rows = [] if ctx.times is None else ctx.times.reset_index(names="run").to_dict(orient="records")
    shares = {b: {"step_share": s, "step_time_sum_s": t, "wall_s": w} for b, (s, t, w) in ctx.step_shares.items()}
    return {"unit": "s", "runs": rows, "batches": shares}


def _clean(obj: Any) -> Any:
    """JSON-safe copy: NaN/inf become null (strict JSON readers reject NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item"):
        return _clean(obj.item())
    return obj


def cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return "" if v is None else str(v)


def _csv(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ""
    if isinstance(v, (list, tuple)):
        return " ".join(str(x) for x in v)
    return v
