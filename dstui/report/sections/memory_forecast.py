"""Report section "Memory: forecast vs measured": how good the before-launch forecast was (issue 14).

The forecast (:mod:`dstui.analysis.forecast`, judged by
:mod:`dstui.analysis.forecast_check`) is GPU memory per rank. It is
compared with ``torch.cuda.max_memory_allocated`` of finished GPU runs only:
a CPU run's ``mem_peak`` is its process's RSS (interpreter, torch's
libraries, host copies), which a per-GPU forecast does not describe, so the
section says so instead of printing a meaningless error.
"""

from __future__ import annotations

import math
from typing import Any

from dstui.report.context import ReportContext
from dstui.report.mdformat import code, esc, table

GOAL_PCT = 15.0  # issue 14: within 15% of the measured peak

EXPLAIN = (
    "Forecast: peak GPU memory per rank, rebuilt from each condition's settings as `dstui run --dry-run` "
    "forecasts it without history: the larger of the end of forward (model states without the gradients + "
    "activations, analytic) and the optimizer step (model states, DeepSpeed's `estimate_zero*_model_states_mem_needs` "
    "estimators, + what the step adds), plus framework overhead (the ds_config's buckets). "
    "Measured: `torch.cuda.max_memory_allocated` of rank 0, mean over the condition's finished GPU runs. "
    "Error = (forecast - measured) / measured: positive means the forecast was too high."
)


def _num(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def _oom_cell(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else ("yes" if v else "no")


def forecast_vs_measured(ctx: ReportContext) -> str:
    """The table per condition and a line on how many are within the goal; '' when nothing was forecast."""
    head = "## Memory: forecast vs measured\n\n"
    if ctx.forecast_missing:
        return head + (
            f"No forecast: its model-state estimators come from DeepSpeed, which is not importable here "
            f"({code(ctx.forecast_missing)}; `pip install 'dstui[train]'`).\n"
        )
    frame = ctx.memory_forecast
    if frame is None or frame.empty:
        return ""
    lines = [EXPLAIN, ""]
    gpu = [r for _, r in frame.iterrows() if "cuda" in str(r["device"]).split(",")]
    if not gpu:
        lines += [
            "These runs ran on the CPU, so there is no GPU peak to compare with: the CPU figure in the Memory "
            "section is the process's peak RSS (interpreter, torch's libraries, host copies), not what the "
            "forecast describes. The forecasts below are what each condition would need per GPU.",
            "",
        ]
    errors = [(r["condition"], _num(r["error_pct"])) for r in gpu if _num(r["error_pct"]) is not None]
    if errors:
        within = sum(abs(e) <= GOAL_PCT for _, e in errors)
        worst = max(errors, key=lambda x: abs(x[1]))
        lines += [f"{within} of {len(errors)} measured conditions within {GOAL_PCT:g}% of the measured peak; "
                  f"largest error: {esc(worst[0])} at {worst[1]:+.1f}%.", ""]  # fmt: skip
    if gpu and frame["predicted_oom"].isna().all():
        lines += ["Predicted OOM: '-' where the GPU memory the forecast was held against is not recorded "
                  "(only runs skipped as `predicted OOM` name it).", ""]  # fmt: skip
    rows = []
    for _, r in frame.iterrows():
        measured, err = _num(r["measured_gib"]), _num(r["error_pct"])
        if measured is None:
            cell = "no GPU peak (CPU run)" if str(r["device"]) == "cpu" else "-"
        else:
            cell = f"{measured:.2f}"
        rows.append([r["condition"], f"{r['forecast_gib']:.2f}", cell, "-" if err is None else f"{err:+.1f}%",
                     _oom_cell(r["predicted_oom"]), r["outcome"]])  # fmt: skip
    lines.append(table(["condition", "forecast (GiB/GPU)", "measured peak (GiB)", "error", "predicted OOM", "runs"], rows))
    return head + "\n".join(lines) + "\n"
