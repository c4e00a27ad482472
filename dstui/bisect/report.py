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
    "verdict": "the runs' own check (verify batch or Ulysses sp-check): bad when a run FAILs, good when every run "
    "PASSes; a run that crashed gives no verdict (skip). No baseline: the good end is run only when the answer is "
    "the first candidate after it",
}


def method(metric: str, threshold_text: str) -> str:
    """How a commit was judged, in words (for the report and `dstui bisect --help`)."""
    if metric in _METHOD:
        return _METHOD[metric]
    return (f"`{metric}` as the runs recorded it (per step; a summary value as one point): bad when, at some step, "
            f"the mean over runs differs from the good end's by more than {threshold_text}")  # fmt: skip


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _path(out: Outcome) -> str:
    from dstui.bisect.search import path

    verdicts = {i: t.decision.verdict for i, t in out.tested.items()}
    steps = [f"`{out.line[i].short}` {verdicts[i]}" for i in path(len(out.line), verdicts)]
    return " -> ".join(steps) or "nothing tested"


def markdown(b: Bisect, out: Outcome) -> str:
    o, noun = b.o, b.noun
    threshold = o.limit.text()
    what = "releases from the package index" if noun == "release" else "first-parent commits"
    limits = {"verdict": "", "loss": f"loss tolerance {o.loss_tol:g}; "}.get(o.metric, f"threshold {threshold}; ")
    if o.needs_base:
        base_verdict = "baseline"
    elif b.base.samples:
        base_verdict = b.base.samples[-1].get("verdict") or "no verdict"
    else:
        base_verdict = "not run (the answer does not rest on it)" if not b.good_known else "good (shown before)"
    lines = [
        f"## Bisect: {o.metric} of `{b.m.condition}` ({b.m.spec.name}), over {noun}s",
        "",
        f"**{out.answer()}**",
        "",
        f"- range: good `{b.good.short}` {b.good.subject!r} .. bad `{out.line[-1].short}` "
        f"{out.line[-1].subject!r}: {len(out.line)} {what} after good",
        f"- decision: {method(o.metric, threshold)} ({limits}runs per {noun}: {o.repeats}, up to {o.max_repeats})",
        f"- search path (halving, skips stepped around): {_path(out)}",
        *([f"- {b.context}"] if b.context else []),
        f"- {'repository: `' + str(b.m.repo) + '`' if noun == 'commit' else 'envs: one per release, from PyPI'}; "
        "MLflow runs carry `dstui.revision.sha` and `dstui.bisect` tags",
        "",
        f"| # | {noun} | subject | verdict | verdict or measured change vs good | runs | batch |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        f"| good | `{b.good.short}` | {_cell(b.good.subject)} | {_cell(base_verdict)} | - | {b.base.runs_done()} | "
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
    lines += ["", f"{len(out.tested)} of {len(out.line)} {noun}s tested, {untested} never built or run.", ""]
    return "\n".join(lines)
