"""Markdown reports with charts, CSV and JSON, built from MLflow.

:func:`export_report` is the one entry point; the CLI (``dstui report``) and
the TUI's results view both call it. It reads runs from MLflow (so live, old,
imported and team-server runs all work), computes figures with
:mod:`dstui.analysis.runs`, draws PNGs with :mod:`dstui.report.charts` and writes::

    DIR/report.md            the report (charts referenced by relative path)
    DIR/*.png                charts
    DIR/runs.csv             one row per run: identity, status, statistics, settings
    DIR/conditions.csv       one row per condition (what the report's tables show)
    DIR/data.json            everything: params, tags, metrics, statistics, per-step histories
    DIR/grid_iter_time.csv   model x micro_batch grids per ZeRO/offload level (when they apply)
    DIR/grid_mem.csv

(the CSV and JSON files are written by :mod:`dstui.report.files`)
and logs DIR as the ``report`` artifact of the batch's parent run. Failed
runs are never dropped: they appear in every table with their reason.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from dstui.analysis import runs as an
from dstui.analysis.fetch import read_artifact
from dstui.analysis.runs import Progress, RunData
from dstui.analysis.system import fetch_system
from dstui.core.errors import DstuiError
from dstui.report import files as report_files
from dstui.report import found, mdformat
from dstui.report.context import DEFAULT_TOLERANCE, ReportContext
from dstui.report.draw import draw
from dstui.report.sections import checks, memory_forecast, overview, performance, quality, timing
from dstui.report.sections.quality import ds_config_of
from dstui.tracking import tags as tag_keys


def export_report(
    experiment: str,
    out_dir: str | Path,
    *,
    batch: str | None = None,
    runs: Sequence[str] | None = None,
    baseline: str | None = None,
    tolerance: float | None = None,
    tracking_uri: str | None = None,
    progress: Progress | None = None,
    log_artifact: bool = True,
) -> Path:
    """Write a report for an experiment (optionally one batch or given run ids); return report.md.

    ``progress(fraction, message)`` is called between stages so the TUI can
    show where a long export is. ``log_artifact=False`` skips uploading the
    folder to the batch's parent run (for previews).
    """
    from dstui.core import paths
    from dstui.tracking import client as tracking

    def step(frac: float, msg: str) -> None:
        if progress is not None:
            progress(frac, msg)

    uri = tracking_uri or paths.tracking_uri()
    out = Path(out_dir)
    _check_folder(out)
    client = tracking.client(uri)

    step(0.0, "searching runs")
    exp, data = found.fetch_runs(client, experiment, batch=batch, run_ids=runs)
    step(0.1, f"reading metric histories of {len(data)} runs")
    method = an.fetch_histories(client, uri, data, progress=progress)
    step(0.6, "computing statistics")
    an.assign_labels(data)
    for r in data:
        r.stats = an.compute_run_stats(r)
    fetch_system(client, data)
    ctx = ReportContext(experiment, exp, batch, uri, tolerance, method, data)
    for b in [batch] if batch else ctx.batches:
        parent = an.find_batch_parent(client, exp.experiment_id, b)
        if parent is not None:
            ctx.parents[b] = parent
    ctx.compute(baseline)
    ctx.commands = _commands(data)
    ctx.ds_configs = {r.run_id: ds_config_of(r) for r in data}

    parent = None
    parent_batch = batch or (ctx.batches[0] if len(ctx.batches) == 1 else None)
    if log_artifact and parent_batch:
        parent = ctx.parents.get(parent_batch)
        ctx.parent_run_id = parent.info.run_id if parent is not None else None
    created = _make_folder(out)  # only now: a report that fails before this leaves no folder behind
    try:
        step(0.7, "drawing charts")
        draw(ctx, out)
        step(0.85, "writing report")
        report_files.write_runs_csv(out / "runs.csv", data)
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
    if parent is not None:
        step(0.95, "logging the report to MLflow")
        tracking.log_report(client, parent.info.run_id, out)  # + report.md MLflow can preview
    step(1.0, f"report written to {report}")
    return report


def _check_folder(out: Path) -> None:
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
        performance.throughput(ctx),
        performance.system(ctx),
        timing.where_time_went(ctx),
        checks.parity(ctx),
        checks.revisions(ctx),
        checks.verify(ctx),
        checks.sp_check(ctx),
        quality.grids(ctx),
        quality.quality(ctx),
        quality.recommendations(ctx),
        quality.appendix(ctx),
    ]
    return mdformat.neutralize("\n".join(p for p in parts if p).rstrip() + "\n")


__all__ = ["DEFAULT_TOLERANCE", "ds_config_of", "export_report", "render"]


def _commands(runs: Sequence[RunData]) -> dict[str, str]:
    """Exact argv of each run: tag dstui.cmd, else the artifact run/cmd.txt."""
    out = {}
    for r in runs:
        cmd = r.tags.get(tag_keys.CMD, "")
        if not cmd and r.artifact_uri:
            cmd = read_artifact(r, "run/cmd.txt")
        out[r.run_id] = cmd
    return out
