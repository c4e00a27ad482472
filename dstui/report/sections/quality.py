"""Report sections at the end: grids, data quality, recommendations, appendix (runs, commands, configs)."""

from __future__ import annotations

import json
import math
from typing import Any

from dstui.analysis import runs as an
from dstui.analysis import speed
from dstui.analysis.runs import RunData
from dstui.report.context import ReportContext
from dstui.report.files import cell
from dstui.report.mdformat import bold, code, esc, escs, fence, img, table
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
        f"Outlier rule: a post-warm-up iteration slower than {an.OUTLIER_FACTOR:g}x the median iteration of "
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
    bad_lines = [(r.run_name, r.tags[tag_keys.BAD_METRIC_LINES]) for r in ctx.runs if r.tags.get(tag_keys.BAD_METRIC_LINES)]
    if bad_lines:
        lines += ["", "Output lines dstui could not read as metrics (counted and skipped; the run's own text, shown "
                  "verbatim):", ""]  # fmt: skip
        lines.append(table(["run", "bad lines"], [[name, code(text, 500)] for name, text in bad_lines[:30]]))
    if "iter_series" in ctx.images:
        lines += ["", img(ctx, "iter_series", "iteration time per step")]
    lines.append(
        f"\nMetric histories read {_METHODS.get(ctx.method, ctx.method)}; "
        "system metrics (`system/...`) stay in MLflow and are not part of this report."
    )
    return "\n".join(lines) + "\n"


def recommendations(ctx: ReportContext) -> str:
    lines = ["## Recommendations", ""]
    timed = [c for c in ctx.train if c.iter_time_mean is not None]
    if not timed:
        lines.append("No usable timings: nothing to recommend yet.")
        return "\n".join(lines) + "\n"
    order = speed.ranked(ctx.train, ctx.speed_basis)
    if order:
        fast = order[0]
        per = " (tokens per step differ: compared in tokens/s)" if ctx.speed_basis == "tokens" else ""
        lines.append(f"- **Fastest**: {esc(fast.label)} ({ctx.speed(fast)}){per}.")
    mem = [c for c in ctx.train if c.mem_peak_max is not None]
    if mem:
        low = min(mem, key=lambda c: c.mem_peak_max)  # type: ignore[arg-type, return-value]
        lines.append(f"- **Least memory**: {esc(low.label)} ({low.mem_peak_gb:.3f} GiB peak).")
    lossy = [c for c in ctx.train if c.final_loss is not None and math.isfinite(c.final_loss)]
    if lossy:
        best = min(lossy, key=lambda c: c.final_loss)  # type: ignore[arg-type, return-value]
        spread = max(c.final_loss for c in lossy) - best.final_loss  # type: ignore[operator]
        text = f"- **Best final loss**: {esc(best.label)} ({best.final_loss:.6f})"
        if spread <= ctx.tolerance:
            text += f" — but all conditions end within {ctx.tolerance:g} of each other, so loss does not separate them"
        lines.append(text + ".")
    front = an.pareto(ctx.train, ctx.speed_basis)
    if len(front) > 1:
        lines.append(
            "- **Speed / memory trade-off**: no condition is both faster and smaller than these: "
            + "; ".join(f"{esc(c.label)} ({ctx.speed(c)}, {c.mem_peak_gb:.2f} GiB)" for c in front)
            + ". Pick the fastest that fits your memory budget."
        )
    elif len(front) == 1:
        lines.append(f"- **Speed / memory trade-off**: {esc(front[0].label)} is both the fastest and the smallest of the timed conditions.")
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


def appendix(ctx: ReportContext) -> str:
    lines = ["## Appendix", "", "### MLflow runs", ""]
    if ctx.parent_run_id:
        lines.append(f"Parent (batch) run: {code(ctx.parent_run_id)}.\n")
    lines.append(table(
        ["run", "condition", "revision", "repeat", "status", "batch", "MLflow run id"],
        [[r.run_name, r.condition, r.revision, r.repeat, "OOM" if r.oom else r.status, r.batch, code(r.run_id)] for r in ctx.runs],
    ))
    lines += ["", "### Commands", ""]
    for r in ctx.runs:
        cmd = ctx.commands.get(r.run_id) or "(not recorded)"
        lines += [f"{code(r.run_name)}:", "", fence(cmd.strip()), ""]
    lines += ["### DeepSpeed configs", ""]
    groups: dict[str, list[str]] = {}
    for r in ctx.runs:
        cfg = ds_config_of(r)
        if not cfg:
            continue
        text = json.dumps(cfg, indent=2, sort_keys=True)
        labels = groups.setdefault(text, [])
        if r.label not in labels:
            labels.append(r.label)
    if not groups:
        lines.append("No `ds.*` params were recorded.")
    for text, labels in groups.items():
        lines += [f"Used by: {escs(labels)}", "", fence(text, "json"), ""]
    return "\n".join(lines) + "\n"


def ds_config_of(run: RunData) -> dict[str, Any]:
    """The ds_config rebuilt from the flattened ``ds.*`` params."""
    cfg: dict[str, Any] = {}
    for k, v in sorted(run.params.items()):
        if not k.startswith("ds."):
            continue
        node = cfg
        parts = k[3:].split(".")
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                break
            node = nxt
        else:
            node[parts[-1]] = an.parse_value(v)
    return cfg
