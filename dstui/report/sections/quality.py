"""Report sections at the end: grids, data quality, recommendations, appendix (runs, commands, configs)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from dstui.analysis.comparable import numerics_differences
from dstui.analysis.fetch import read_artifact
from dstui.analysis.grids import pareto
from dstui.analysis.intervals import RECOMMENDED_REPEATS
from dstui.analysis.rundata import OUTLIER_FACTOR, RunData
from dstui.report.context import ReportContext
from dstui.report.files import cell
from dstui.report.mdformat import bold, code, codes, esc, escs, fence, img, table
from dstui.report.sections.overview import MEMORY_SAME
from dstui.tracking import tags as tag_keys

_METHODS = {
    "sqlite": "directly from the SQLite store (fast path)",
    "sql": "from the SQL store with one query per run",
    "api": "through MLflow's get_metric_history",
}


def grids(ctx: ReportContext) -> str:
    if not ctx.grid:
        return ""
    lines = ["## Grids by model and micro batch", ""]
    lines.append(
        "Rows: model; columns: micro batch per GPU; one table per ZeRO stage / offload level. "
        "Cells are means over usable repeats; **OOM** = every run of the cell ran out of memory, "
        "**FAIL** = failed for another reason, empty = not run. Also in `grid_iter_time.csv` and `grid_mem.csv`.\n"
    )
    for name, title in (("iter_time", "Iteration time (s)"), ("mem", "Peak memory (GiB)")):
        lines += [f"### {title}", ""]
        for level, frame in ctx.grid[name].items():
            rows = [[model, *[cell(v) for v in frame.loc[model].tolist()]] for model in frame.index]
            lines += [bold(level), "", table(["model \\ micro batch", *frame.columns.tolist()], rows), ""]
    return "\n".join(lines) + "\n"


def quality(ctx: ReportContext) -> str:
    lines = ["## Data quality", ""]
    rows = []
    for c in ctx.conds:
        usable = [r for r in c.runs if r.usable]
        pts = [r.stats.get("points", 0) for r in c.runs]
        warm = sorted({r.stats.get("warmup_steps", 0) for r in usable}) or [0]
        flags = []
        if any(r.stats.get("warmup_used_all") for r in usable):
            flags.append("shorter than warm-up")
        if any(r.stats.get("loss_nan") for r in usable):
            flags.append("NaN loss")
        if usable and not any("iter_time" in r.history for r in usable):
            flags.append("no iteration times")
        if c.n_overlapped:
            flags.append(f"{c.n_overlapped} timed beside other runs" + (" (timings left out)" if c.n_timings_left_out else ""))
        rows.append([
            c.label,
            f"{c.n_usable}/{c.n_runs}",
            ", ".join(str(p) for p in pts),
            ", ".join(str(w) for w in warm),
            c.iter_points,
            c.outliers,
            "; ".join(flags) or "-",
        ])
    lines.append(
        f"Outlier rule: a post-warm-up iteration slower than {OUTLIER_FACTOR:g}x the median iteration of "
        "its run (e.g. a checkpoint, a GC pause or a noisy neighbour). Outliers stay in the statistics; "
        "they are listed so that you can judge them.\n"
    )
    lines.append(table(
        ["condition", "usable runs", "points per run", "warm-up steps", "iterations in stats", "outliers", "flags"], rows
    ))
    out_rows = []
    for r in ctx.runs:
        for s, v in zip(r.stats.get("outlier_steps", []), r.stats.get("outlier_values", []), strict=False):
            out_rows.append([r.run_name, s, ctx.t(v), f"{v / r.stats['iter_time_median']:.1f}x"])
    if out_rows:
        lines += ["", f"Outlier iterations ({len(out_rows)}{', first 30' if len(out_rows) > 30 else ''}):", ""]
        lines.append(table(["run", "step", f"time ({ctx.unit})", "x median"], out_rows[:30]))
    lines += overlap_lines(ctx)
    bad_lines = [(r, n) for r in ctx.runs if (n := bad_line_count(r))]
    if bad_lines:
        lines += ["", "Output lines dstui could not read as metrics (counted and skipped; the first one is the run's "
                  "own text, shown verbatim):", ""]  # fmt: skip
        lines.append(table(
            ["run", "bad lines", "first bad line"],
            [[r.run_name, n, code(r.tags.get(tag_keys.FIRST_BAD_LINE, ""), 500) or "-"] for r, n in bad_lines[:30]],
        ))
    if "iter_series" in ctx.images:
        lines += ["", img(ctx, "iter_series", "iteration time per step")]
    lines.append(
        f"\nMetric histories read {_METHODS.get(ctx.method, ctx.method)}; "
        "system metrics (`system/...`) stay in MLflow and are not part of this report."
    )
    return "\n".join(lines) + "\n"


def overlap_lines(ctx: ReportContext) -> list[str]:
    """Runs that other runs shared the machine with while they were timed: which, and what became of their timings."""
    shared = [r for r in ctx.runs if r.stats.get("overlapped")]
    if not shared:
        return []
    if ctx.include_overlapped:
        how = ("their timings are **included** in every speed figure and comparison (`--include-overlapped`): "
               "they measure the runs beside them as much as the run itself")  # fmt: skip
    else:
        how = ("their timings are **left out** of every speed figure and comparison (iteration time, tokens/s, "
               "ratios, fastest); their loss and memory still count. `dstui report --include-overlapped` keeps them")
    rows = []
    for r in shared[:30]:
        kept = r.stats if ctx.include_overlapped else r.stats.get("overlapped_timings") or {}
        mean = kept.get("iter_time_mean")
        rows.append([r.run_name, code(r.tags.get(tag_keys.OVERLAP, ""), 300) or "-",
                     ctx.t(mean) if isinstance(mean, (int, float)) else "-",
                     "kept" if ctx.include_overlapped else "left out"])  # fmt: skip
    return ["", f"{len(shared)} run(s) were timed while other runs shared this machine (tag `dstui.overlapped`): {how}.", "",
            table(["run", "beside it", f"iteration mean ({ctx.unit})", "timings"], rows)]  # fmt: skip


def recommendations(ctx: ReportContext) -> str:
    lines = ["## Recommendations", ""]
    timed = [c for c in ctx.train if c.iter_time_mean is not None]
    if not timed:
        lines.append("No usable timings: nothing to recommend yet.")
        return "\n".join(lines) + "\n"
    lines += [line for line in (_speed_line(ctx), _memory_line(ctx), _loss_line(ctx)) if line]
    if (line := _tradeoff_line(ctx)) is not None:
        lines.append(line)
    fails = [p.label for p in ctx.parity if p.verdict == "FAIL"]
    if fails:
        lines.append(f"- Before adopting {escs(fails)}: their loss differs from the condition they were compared with "
                     f"beyond {ctx.tolerance:g}.")  # fmt: skip
    oom = [c.label for c in ctx.train if c.n_oom]
    if oom:
        lines.append(f"- Out of memory: {escs(oom)} — try a higher ZeRO stage, offload or a smaller micro batch.")
    lines.append("")
    lines.append(img(ctx, "tradeoff", "speed/memory trade-off"))
    return "\n".join(lines) + "\n"


def _tradeoff_line(ctx: ReportContext) -> str | None:
    """The speed/memory Pareto front, by means; said to be unbounded where the speed ratios are."""
    front = pareto(ctx.train, ctx.speed_basis)
    bounded = ctx.fastest is not None and ctx.fastest.shown
    caveat = "" if bounded else " (by mean speed; the data do not bound the speed ratios, see Speed above)"
    if len(front) > 1:
        return ("- **Speed / memory trade-off**: no condition is both faster and smaller than these" + caveat + ": "
                + "; ".join(f"{esc(c.label)} ({ctx.speed(c)}, {c.mem_peak_gb:.2f} GiB)" for c in front)
                + ". Pick the fastest that fits your memory budget.")  # fmt: skip
    if len(front) == 1:
        what = "is both the fastest and the smallest" if bounded else "has both the best mean speed and the least memory"
        return f"- **Speed / memory trade-off**: {esc(front[0].label)} {what} of the timed conditions{caveat}."
    return None


def _speed_line(ctx: ReportContext) -> str | None:
    """The fastest condition, only where its ratio over every other is bounded above 1."""
    claim = ctx.fastest
    if claim is None or not claim.over:
        return None
    per = " (tokens per step differ: compared in tokens/s)" if ctx.speed_basis == "tokens" else ""
    if claim.shown:
        c, sr = claim.over[0]
        return (f"- **Fastest**: {esc(claim.leader.label)} ({ctx.speed(claim.leader)}){per}: {sr.text()} the speed of "
                f"the next, {esc(c.label)}.")  # fmt: skip
    c, sr = claim.unbounded()[0]
    return (f"- **Speed**: no condition is shown to be faster than the others ({esc(claim.leader.label)} over "
            f"{esc(c.label)}: {sr.text()}); {RECOMMENDED_REPEATS}+ repeats per condition (`repeats:` in the spec) "
            f"bound the ratios.")  # fmt: skip


def _memory_line(ctx: ReportContext) -> str | None:
    mem = [c for c in ctx.train if c.mem_peak_max is not None]
    if len(mem) < 2:
        return None
    low = min(mem, key=lambda c: c.mem_peak_max)  # type: ignore[arg-type, return-value]
    high = max(mem, key=lambda c: c.mem_peak_max)  # type: ignore[arg-type, return-value]
    what = "peak RSS" if ctx.on_cpu else "peak"
    if high.mem_peak_max - low.mem_peak_max <= MEMORY_SAME * high.mem_peak_max:  # type: ignore[operator]
        return f"- **Memory**: all within {MEMORY_SAME:.0%} ({low.mem_peak_gb:.3f} to {high.mem_peak_gb:.3f} GiB {what})."
    return f"- **Least memory**: {esc(low.label)} ({low.mem_peak_gb:.3f} GiB {what}; most: {esc(high.label)}, {high.mem_peak_gb:.3f} GiB)."


def _loss_line(ctx: ReportContext) -> str | None:
    """Final loss ranked only among conditions that should compute the same numbers, with the tolerance."""
    lossy = [c for c in ctx.train if c.final_loss is not None and math.isfinite(c.final_loss)]
    if len(lossy) < 2:
        return None
    differ = sorted({d.setting for c in lossy[1:] for d in numerics_differences(c.runs, lossy[0].runs)})
    if differ:
        return (f"- **Final loss**: not ranked: the conditions differ in {codes(differ)}, which "
                f"{'changes' if len(differ) == 1 else 'change'} the numerics by design (final losses are in the "
                "Conditions table; see Loss parity).")  # fmt: skip
    low = min(lossy, key=lambda c: c.final_loss)  # type: ignore[arg-type, return-value]
    high = max(lossy, key=lambda c: c.final_loss)  # type: ignore[arg-type, return-value]
    spread = high.final_loss - low.final_loss  # type: ignore[operator]
    if spread <= ctx.tolerance:
        return (f"- **Final loss**: every condition ends within {ctx.tolerance:g} of each other ({low.final_loss:.6f} "
                f"to {high.final_loss:.6f}): loss does not separate them.")  # fmt: skip
    return (f"- **Lowest final loss**: {esc(low.label)} ({low.final_loss:.6f}); highest {esc(high.label)} "
            f"({high.final_loss:.6f}): {spread:.3g} apart, beyond the tolerance {ctx.tolerance:g} (see Loss parity).")


def appendix(ctx: ReportContext) -> str:
    lines = ["## Appendix", "", "### MLflow runs", ""]
    if ctx.logged_to:
        lines.append("This report is logged as artifact `report` to the parent (batch) run of every batch it covers: "
                     + ", ".join(f"{code(b)}: {code(rid)}" for b, rid in ctx.logged_to.items()) + ".\n")  # fmt: skip
    lines.append(table(
        ["run", "condition", "revision", "repeat", "status", "batch", "MLflow run id"],
        [[r.run_name, r.condition, r.revision, r.repeat, "OOM" if r.oom else r.status, r.batch, code(r.run_id)] for r in ctx.runs],
    ))
    lines += ["", "### Commands", ""]
    for r in ctx.runs:
        cmd = ctx.commands.get(r.run_id) or "(not recorded)"
        lines += [f"{code(r.run_name)}:", "", fence(cmd.strip()), ""]
    lines += ["### DeepSpeed configs", ""]
    lines += ds_configs(ctx)
    return "\n".join(lines) + "\n"


def bad_line_count(run: RunData) -> int:
    """The run's count of unreadable metric lines (tag ``dstui.bad_metric_lines``; MLflow keeps it as text).

    The tag is "0" on every run that finished cleanly, and "0" is a true
    string: a count, not text, decides whether a run belongs in the table.
    """
    try:
        return max(0, int(float(run.tags.get(tag_keys.BAD_METRIC_LINES) or 0)))
    except ValueError:
        return 0


def ds_configs(ctx: ReportContext) -> list[str]:
    """The ds_config.json files the runs ran with, one block per distinct config, with who used it."""
    groups: dict[str, list[RunData]] = {}
    missing = []
    for r in ctx.runs:
        cfg = ctx.ds_configs.get(r.run_id)
        if cfg is None:
            missing.append(r.run_name)
            continue
        groups.setdefault(json.dumps(cfg, indent=2, sort_keys=True), []).append(r)
    lines = []
    if groups:
        lines += ["The `ds_config.json` each run ran with (its MLflow artifact); runs with identical configs share one block.", ""]
    for text, users in groups.items():
        lines += [f"Used by: {escs(_users(ctx, users))}", "", fence(text, "json"), ""]
    if missing:
        shown = escs(missing[:30]) + (f" and {len(missing) - 30} more" if len(missing) > 30 else "")
        lines += [f"No `ds_config.json` was recorded for: {shown}.", ""]
    return lines


def _users(ctx: ReportContext, users: list[RunData]) -> list[str]:
    """Condition labels whose every run is in ``users``; run names for the rest."""
    ids = {r.run_id for r in users}
    out: list[str] = []
    for r in users:
        whole = all(o.run_id in ids for o in ctx.runs if o.label == r.label)
        name = r.label if whole else r.run_name
        if name not in out:
            out.append(name)
    return out


def ds_config_of(run: RunData) -> dict[str, Any] | None:
    """The ds_config.json the run ran with, as recorded; None when there is none to read.

    Not rebuilt from the flattened ``ds.*`` params: those leave out what a
    setting already says (stage, micro batch, dtype) and would show a config
    no run used. Read from the child run's top-level artifact, else the copy
    in its ``run/`` folder artifact, else the run folder on this machine
    (tag ``dstui.run_dir``).
    """
    for rel in ("ds_config.json", "run/ds_config.json"):
        cfg = _json_object(read_artifact(run, rel)) if run.artifact_uri else None
        if cfg is not None:
            return cfg
    folder, _ = tag_keys.split_run_dir(run.tags.get(tag_keys.RUN_DIR, ""))
    if folder:
        path = Path(folder) / "ds_config.json"
        try:
            return _json_object(path.read_text(encoding="utf-8")) if path.is_file() else None
        except OSError:
            return None
    return None


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text) if text.strip() else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
