"""Report section "Tuning": what `dstui tune` probed, predicted and measured, what it left out, what it cost.

:func:`markdown` takes the analysis result (:class:`dstui.analysis.tuning.TuneSummary`)
and the chart's file name; `dstui tune` writes it as ``tuning.md`` beside its
state, and `dstui report` includes it for an experiment whose batch was a search
(:func:`tuning`). Every name and reason is escaped: they come from a file.
"""

from __future__ import annotations

import math
from collections import defaultdict

from dstui.analysis.tuning import Ranked, TuneSummary
from dstui.core.formatting import fmt_gib, fmt_sig
from dstui.report.context import ReportContext
from dstui.report.mdformat import Md, bold, code, esc, img, table

Z90 = 1.645

EXPLAIN = (
    "Each probe is a short run of one candidate: warm-up steps left out, then steps until the 95% interval of its "
    "mean step time is tight enough to rank it (or lies above the best one's), within a hard time box. A "
    "candidate is probed only while the time model's optimistic end (the spec's confidence, split over the candidates "
    "left) could beat the best measured step time by the margin; the prediction shown is the one it was chosen on, "
    "before it ran."
)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{fmt_sig(seconds * 1e3)}"


def _predicted(r: Ranked) -> str:
    if r.predicted_s is None:
        return "-"
    sd = r.predicted_log_sd if r.predicted_log_sd is not None and math.isfinite(r.predicted_log_sd) else None
    if sd is None:
        return _ms(r.predicted_s)
    lo, hi = r.predicted_s * math.exp(-Z90 * sd), r.predicted_s * math.exp(Z90 * sd)
    return f"{_ms(r.predicted_s)} [{_ms(lo)}, {_ms(hi)}]"


def _measured(r: Ranked) -> str:
    if r.measured_s is None:
        return "-"
    return f"{_ms(r.measured_s)} ± {_ms(r.measured_half_s)}" if r.measured_half_s is not None else _ms(r.measured_s)


def headline(s: TuneSummary) -> str:
    """The answer in one paragraph: the winner and its numbers, how many probes, why the search stopped."""
    win = next((r for r in s.ranking if r.winner), None)
    probes = len(s.ranking)
    if win is None:
        return f"No candidate was measured ({probes} probes). The search stopped: {esc(s.stop_reason)}."
    ties = [r.candidate for r in s.ranking if r.within_noise]
    tie = f" Within its noise: {', '.join(esc(t) for t in ties)}." if ties else ""
    rate = f", {fmt_sig(win.tokens_per_s)} tokens/s" if win.tokens_per_s else ""
    return (f"Winner: {bold(win.candidate)}, {_measured(win)} ms per optimizer step{rate}; {probes} probes of "
            f"{s.candidates} candidates ({len(s.not_probed)} not probed: predicted not to win; {len(s.left_out)} "
            f"left out). The search stopped: {esc(s.stop_reason)}.{tie}")  # fmt: skip


def cost_line(s: TuneSummary) -> str:
    c = s.cost
    if not c:
        return ""
    gpu = f", {c['gpu_s']:.0f} GPU-seconds" if c.get("gpu_s") else " (CPU ranks: no GPU time)"
    budget = f"; budget {c['budget_s']:.0f} s" if c.get("budget_s") else ""
    return (f"Cost of the search: {int(c.get('probes', 0))} probes, {c.get('probe_wall_s', 0.0):.0f} s of probe wall "
            f"time, launch to exit{gpu}; {c.get('search_wall_s', 0.0):.0f} s for the whole search{budget}.")  # fmt: skip


def _ranking_table(s: TuneSummary) -> Md:
    rows = []
    for i, r in enumerate(s.ranking, 1):
        err = "-" if r.error_pct is None else f"{r.error_pct:+.1f}%"
        name = Md(bold(r.candidate)) if r.winner else r.candidate
        rows.append([str(i), name, _predicted(r), _measured(r), err, fmt_sig(r.tokens_per_s) if r.tokens_per_s else "-",
                     fmt_gib(r.mem_peak, 2), fmt_gib(r.forecast_mem, 2), r.outcome,
                     "-" if r.wall_s is None else f"{r.wall_s:.0f}"])  # fmt: skip
    head = ["#", "candidate", "predicted ms [90%]", "measured ms ± 95%", "error", "tokens/s", "peak memory",
            "forecast memory/GPU", "probe ended", "wall s"]  # fmt: skip
    return table(head, rows)


def _left_out_table(s: TuneSummary) -> Md:
    by_reason: dict[str, list[str]] = defaultdict(list)
    for row in s.left_out:
        by_reason[row.reason].append(row.candidate)
    rows = [[reason, str(len(names)), ", ".join(names)] for reason, names in by_reason.items()]
    return table(["why left out", "count", "candidates"], rows)


CHART_ALT = "predicted vs measured step time per probe"


def image_line(file_name: str) -> str:
    """The chart's markdown line for a chart file beside the section ('' for none)."""
    return f"![{esc(CHART_ALT)}]({file_name})\n" if file_name else ""


def markdown(s: TuneSummary, image_md: str = "") -> str:
    """The section's markdown ('' for an empty summary); ``image_md`` is the chart's image line."""
    if not s.ranking and not s.left_out:
        return ""
    lines = ["## Tuning", "", headline(s), "", EXPLAIN, ""]
    errors = s.error_summary()
    if errors:
        lines += [f"Time model (source: {esc(s.model_source or '?')}): the probes' predictions were off by "
                  f"{errors[0]:.1f}% (median) and {errors[1]:.1f}% at worst.", ""]  # fmt: skip
    if cost_line(s):
        lines += [cost_line(s), ""]
    if image_md:
        lines += [image_md]
    lines += ["### Probes, fastest first", "", _ranking_table(s), ""]
    if s.machine.startswith("cpu"):
        lines += ["On CPU ranks the peak memory is the process's RSS, not the GPU memory the forecast describes.", ""]
    if s.not_probed:
        rows = [[r.candidate, _ms(r.predicted_s), _ms(r.optimistic_s)] for r in s.not_probed]
        lines += ["### Not probed: predicted not to win", "",
                  table(["candidate", "predicted ms", "optimistic end ms"], rows), ""]  # fmt: skip
    if s.left_out:
        lines += ["### Left out before any probe", "", _left_out_table(s), ""]
    if s.winner_spec:
        lines += [f"The winner's spec: {code(s.winner_spec)} (`dstui run` it).", ""]
    if s.dropped:
        lines += [f"{s.dropped} entries of the search's record were not readable and are not shown.", ""]
    return "\n".join(lines)


def tuning(ctx: ReportContext) -> str:
    """The section of a report on a search's experiment; '' for any other report."""
    if ctx.tuning is None:
        return ""
    return markdown(ctx.tuning, img(ctx, "tuning", CHART_ALT))
