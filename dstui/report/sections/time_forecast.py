"""Report section "Step time: predicted vs measured": how good the time model is on these runs.

The prediction of each condition is the time model calibrated on the *other*
conditions of the same machine kind (:func:`dstui.analysis.time_check.time_vs_measured`):
the error a user meets on a configuration not measured yet, recorded for every
finished run as the memory forecast's is. The uncalibrated first-principles
value is shown beside it.
"""

from __future__ import annotations

from dstui.analysis.time_check import error_summary
from dstui.core.formatting import fmt_sig
from dstui.report.context import ReportContext
from dstui.report.mdformat import table

EXPLAIN = (
    "Predicted: the step time the time model (`dstui list`, Compose, `dstui tune`) gives each condition when "
    "calibrated on the other conditions of its machine (leave one condition out); first principles: the "
    "uncalibrated value (FLOPs at the GPU's peak, ZeRO's communication volume, offload traffic). Measured: the "
    "mean step time after warm-up, averaged over the condition's finished runs. Error = (predicted - measured) / "
    "measured."
)


def _ms(seconds: float) -> str:
    return fmt_sig(seconds * 1e3)


def time_vs_measured(ctx: ReportContext) -> str:
    frame = ctx.time_forecast
    if frame is None or frame.empty:
        return ""
    lines = ["## Step time: predicted vs measured", "", EXPLAIN, ""]
    summary = error_summary(frame)
    if summary and len(frame) > 1:
        lines += [f"Over {summary['conditions']} conditions: median error {summary['median_pct']:.1f}%, "
                  f"worst {summary['worst_pct']:.1f}%.", ""]  # fmt: skip
    rows = [[r["condition"], _ms(r["predicted_s"]), _ms(r["prior_s"]), _ms(r["measured_s"]), f"{r['error_pct']:+.1f}%",
             str(r["runs"]), r["source"]] for _, r in frame.iterrows()]  # fmt: skip
    lines.append(table(["condition", "predicted ms", "first principles ms", "measured ms", "error", "runs", "calibrated on"], rows))
    return "\n".join(lines) + "\n"
