"""How good the step-time prediction is: predicted vs measured per condition, after the runs.

Every report judges the time model on the runs it shows, as it judges the memory
forecast (:mod:`dstui.analysis.forecast_check`). A prediction judged on the
runs it was fitted on would flatter it, so each condition is predicted by the
model calibrated on the *other* conditions of its machine kind (leave one
condition out): the error a user meets on a configuration nobody measured yet.
The first-principles prior (no calibration) is shown beside it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from dstui.analysis.forecast import forecastable_shape, settings_of
from dstui.analysis.time_fit import Observation, TimeModel
from dstui.analysis.time_forecast import rel_sd_of
from dstui.analysis.time_model import Hardware, hardware_for, terms
from dstui.tracking import tags as tag_keys

COLUMNS = ["condition", "machine", "predicted_s", "prior_s", "measured_s", "error_pct", "runs", "source"]


def _hardware(run: Any) -> Hardware:
    tags = run.tags
    return hardware_for(tags.get(tag_keys.DEVICE) or "cpu", tags.get(tag_keys.GPU_NAME), tags.get(tag_keys.HOSTNAME) or "?")


def _conditions(runs: Sequence[Any]) -> list[dict[str, Any]]:
    """Per (machine kind, condition): settings, terms, the mean of its finished runs' mean step times."""
    groups: dict[tuple[str, str], list[Any]] = {}
    for run in runs:
        mean = run.metrics.get("summary.iter_time_mean")
        if run.status != "done" or run.kind == "command" or not mean:
            continue
        groups.setdefault((_hardware(run).kind, run.label or run.condition), []).append(run)
    out = []
    for (kind, cond), members in groups.items():
        settings = settings_of(members[0].params)
        shape = forecastable_shape(settings) if settings else None
        if shape is None:
            continue
        hw = _hardware(members[0])
        means = [float(r.metrics["summary.iter_time_mean"]) for r in members]
        rel = statistics.fmean(rel_sd_of(r.metrics) for r in members) / len(members) ** 0.5
        out.append({"condition": cond, "machine": kind, "hw": hw, "terms": terms(settings, shape, hw),
                    "measured_s": statistics.fmean(means), "rel_sd": rel, "runs": len(members)})  # fmt: skip
    return out


def time_vs_measured(runs: Sequence[Any]) -> Any:
    """Predicted (leave one condition out) vs measured mean step time per condition: a pandas frame.

    ``error_pct`` = 100 (predicted - measured) / measured (> 0: predicted too slow). A
    condition alone on its machine kind has nothing to be calibrated on: its
    prediction is the prior's (``source`` says so).
    """
    import pandas as pd

    conds = _conditions(runs)
    rows = []
    for c in conds:
        others = [Observation(o["terms"], o["measured_s"], o["rel_sd"], o["condition"])
                  for o in conds if o["machine"] == c["machine"] and o is not c]  # fmt: skip
        model = TimeModel(c["hw"], others).fit()
        pred = model.predict(c["terms"]).seconds
        prior = TimeModel(c["hw"]).fit().predict(c["terms"]).seconds
        rows.append({
            "condition": c["condition"], "machine": c["machine"], "predicted_s": pred, "prior_s": prior,
            "measured_s": c["measured_s"], "error_pct": 100 * (pred - c["measured_s"]) / c["measured_s"],
            "runs": c["runs"], "source": f"fit on {len(others)} other conditions" if others else "prior (no other condition)",
        })  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)


def error_summary(frame: Any) -> dict[str, float] | None:
    """Median and worst absolute error (%) of a :func:`time_vs_measured` frame; None when empty."""
    if frame is None or frame.empty:
        return None
    errors = frame["error_pct"].abs()
    return {"median_pct": float(errors.median()), "worst_pct": float(errors.max()), "conditions": int(len(frame))}
