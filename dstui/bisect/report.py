"""The bisect's report section (markdown): method, every tested commit, the answer."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dstui.bisect.session import Bisect, Outcome

REPORT_NAME = "report.md"

_METHOD = {
    "iter_time": "bad when significantly slower (Welch t-test, p < 0.05) by at least the threshold; good when "
    "the 95% interval of the ratio to the good commit stays below 1 + threshold; more repeats otherwise",
    "loss": "bad when the largest per-step gap of the mean loss curves exceeds the loss tolerance",
    "mem_peak": "bad when the mean peak memory grew by more than the threshold",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(b: Bisect, out: Outcome) -> str:
    o = b.o
    lines = [
        f"## Bisect: {o.metric} of `{b.m.condition}` ({b.m.spec.name})",
        "",
        f"**{out.answer()}**",
        "",
        f"- range: good `{b.good.short}` {b.good.subject!r} .. bad `{out.line[-1].short}` "
        f"{out.line[-1].subject!r}: {len(out.line)} first-parent commits after good",
        f"- decision: {_METHOD[o.metric]} (threshold {o.threshold * 100:g}%, loss tolerance {o.loss_tol:g}; "
        f"runs per commit: {o.repeats}, up to {o.max_repeats})",
        f"- repository: `{b.m.repo}`; MLflow runs carry `dstui.revision.sha` and `dstui.bisect` tags",
        "",
        "| # | commit | subject | verdict | measured change vs good | runs | batch |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        f"| good | `{b.good.short}` | {_cell(b.good.subject)} | baseline | - | {b.base.runs_done()} | "
        f"{', '.join(b.base.batches)} |",
    ]
    for i, t in sorted(out.tested.items()):
        change = t.decision.change or "-"
        verdict = t.decision.verdict if t.decision.verdict != "skip" else f"skip ({t.decision.why})"
        lines.append(
            f"| {i + 1} | `{t.commit.short}` | {_cell(t.commit.subject)} | {_cell(verdict)} | {_cell(change)} | "
            f"{t.record.runs_done()} | {', '.join(t.record.batches)} |"
        )
    untested = len(out.line) - len(out.tested)
    lines += ["", f"{len(out.tested)} of {len(out.line)} commits tested, {untested} never built or run.", ""]
    return "\n".join(lines)
