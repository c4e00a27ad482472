"""Markdown reports with charts, CSV and JSON, from loaded results.

:func:`write_report` renders a :class:`~dstui.report.context.ReportContext`
(results loaded by :mod:`dstui.usecases.results`, the loader of ``dstui
compare`` and the TUI too); :func:`dstui.usecases.report.export_report` is the
entry point of the CLI (``dstui report``) and the TUI's results view. It draws
PNGs with :mod:`dstui.report.charts` and writes::

    DIR/report.md            the report (charts referenced by relative path)
    DIR/*.png                charts
    DIR/runs.csv             one row per run: identity, status, statistics, settings
    DIR/conditions.csv       one row per condition (what the report's tables show)
    DIR/data.json            everything: params, tags, metrics, statistics, per-step histories
    DIR/grid_iter_time.csv   model x micro_batch grids per ZeRO/offload level (when they apply)
    DIR/grid_mem.csv

(the CSV and JSON files are written by :mod:`dstui.report.files`). Failed
runs are never dropped: they appear in every table with their reason; runs
that never started are listed apart, never as repeats of a condition.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from dstui.analysis.fetch import read_artifact
from dstui.analysis.rundata import Progress, RunData
from dstui.core.errors import DstuiError
from dstui.report import files as report_files
from dstui.report import mdformat
from dstui.report.context import ReportContext
from dstui.report.draw import draw
from dstui.report.sections import (
    checks,
    memory_forecast,
    overview,
    performance,
    quality,
    sequence_parallel,
    time_forecast,
    timing,
    tuning,
)
from dstui.report.sections.quality import ds_config_of
from dstui.tracking import tags as tag_keys


def write_report(ctx: ReportContext, out_dir: str | Path, *, progress: Progress | None = None) -> Path:
    """Write report.md, its charts and data files for loaded results into ``out_dir``; return report.md.

    The folder is created only now, and removed again (what this call created,
    only that) when writing fails: a report that fails leaves nothing behind.
    """

    def step(frac: float, msg: str) -> None:
        if progress is not None:
            progress(frac, msg)

    out = Path(out_dir)
    check_folder(out)
    ctx.commands = _commands(ctx.runs)
    ctx.ds_configs = {r.run_id: ds_config_of(r) for r in ctx.runs}
    created = _make_folder(out)
    try:
        step(0.7, "drawing charts")
        draw(ctx, out)
        step(0.85, "writing report")
        report_files.write_runs_csv(out / "runs.csv", ctx.runs)
        report_files.write_conditions_csv(out / "conditions.csv", ctx.conds, ctx.parity)
        if ctx.grid:
            report_files.write_grid_csv(out / "grid_iter_time.csv", ctx.grid["iter_time"])
            report_files.write_grid_csv(out / "grid_mem.csv", ctx.grid["mem"])
        report_files.write_json(out / "data.json", ctx)
        report = out / "report.md"
        report.write_text(render(ctx), encoding="utf-8")
    except BaseException as e:
        if created is not None:  # what this call created, and only that
            shutil.rmtree(created, ignore_errors=True)
        if isinstance(e, OSError):  # a full disk, a read-only folder: one line, not a traceback
            raise DstuiError(f"cannot write the report into '{out}': {e.strerror or e}") from None
        raise
    return report


def check_folder(out: Path) -> None:
    """Refuse an output path that cannot become a folder, before any work (one line, exit 2)."""
    for p in (out, *out.parents):
        if p.exists():
            if not p.is_dir():
                where = "it" if p == out else f"'{p}'"
                raise DstuiError(f"cannot write the report into '{out}': {where} is a file, not a folder")
            return


def _make_folder(out: Path) -> Path | None:
    """Create ``out`` (and missing parents); return the topmost folder created, None if it existed."""
    top = None
    for p in (out, *out.parents):
        if p.exists():
            break
        top = p
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        if top is not None:
            shutil.rmtree(top, ignore_errors=True)
        raise DstuiError(f"cannot create the report folder '{out}': {e.strerror or e}") from None
    return top


def render(ctx: ReportContext) -> str:
    """The whole report.md: the sections in reading order (empty ones left out).

    Sections escape what they take from runs and specs (:mod:`dstui.report.mdformat`);
    :func:`~dstui.report.mdformat.neutralize` then checks the whole text as
    CommonMark, so a section that forgot still cannot ship live HTML or a foreign link.
    """
    parts = [
        overview.title(ctx),
        overview.summary(ctx),
        overview.setup(ctx),
        overview.conditions(ctx),
        performance.loss(ctx),
        performance.iter_time(ctx),
        performance.memory(ctx),
        memory_forecast.forecast_vs_measured(ctx),
        time_forecast.time_vs_measured(ctx),
        tuning.tuning(ctx),
        performance.throughput(ctx),
        performance.system(ctx),
        timing.where_time_went(ctx),
        checks.parity(ctx),
        checks.revisions(ctx),
        checks.verify(ctx),
        sequence_parallel.section(ctx.sp_rows),
        quality.grids(ctx),
        quality.quality(ctx),
        quality.recommendations(ctx),
        quality.appendix(ctx),
    ]
    return mdformat.neutralize("\n".join(p for p in parts if p).rstrip() + "\n")


__all__ = ["check_folder", "render", "write_report"]


def _commands(runs: Sequence[RunData]) -> dict[str, str]:
    """Exact argv of each run: tag dstui.cmd, else the artifact run/cmd.txt."""
    out = {}
    for r in runs:
        cmd = r.tags.get(tag_keys.CMD, "")
        if not cmd and r.artifact_uri:
            cmd = read_artifact(r, "run/cmd.txt")
        out[r.run_id] = cmd
    return out
