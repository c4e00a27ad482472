"""Exporting a report: load the results, write the folder, log it to the MLflow parent run of every batch it covers.

``dstui report`` and the TUI's Results screen (``e``) both call
:func:`export`; the results come from :func:`dstui.usecases.results.load`, the
loader of ``dstui compare`` and the Results screen too.

A report over several batches belongs to each of them: it is logged to the
parent run of every batch it covers, and :class:`Exported` (and the report's
appendix) says which; a batch without a parent run in MLflow (an import of
runs made by hand) is named as not logged, never skipped in silence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dstui.analysis.rundata import Progress
from dstui.report.context import ReportContext
from dstui.report.markdown import check_folder, write_report
from dstui.tracking import client as tracking
from dstui.usecases import results


@dataclass
class Exported:
    """Where a report went: its report.md, and the MLflow parent runs it was logged to."""

    report: Path
    logged_to: dict[str, str] = field(default_factory=dict)  # batch id -> parent run id
    not_logged: list[str] = field(default_factory=list)  # batches it covers that have no parent run
    asked: bool = True  # logging was asked for (not --no-mlflow-artifact)

    def where(self) -> str:
        """One line saying where the report was logged in MLflow (or that it was not, and why)."""
        if not self.asked:
            return "not logged to MLflow (--no-mlflow-artifact)"
        if not self.logged_to and not self.not_logged:
            return "not logged to MLflow: its runs belong to no batch"
        parts = [f"parent run {rid} of batch {b}" for b, rid in self.logged_to.items()]
        text = ("logged to MLflow as artifact 'report' of " + "; ".join(parts)) if parts else "not logged to MLflow"
        if self.not_logged:
            text += f" (no parent run for batch {', '.join(self.not_logged)})"
        return text


def export(
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
    include_overlapped: bool = False,
) -> Exported:
    """Write a report for an experiment (optionally one batch or given run ids) and log it to MLflow.

    ``progress(fraction, message)`` is called between stages so the TUI can
    show where a long export is. ``log_artifact=False`` skips uploading the
    folder (for previews). ``include_overlapped``: timings taken while other runs shared
    the machine count in speed comparisons (by default they are flagged and left out).
    """
    check_folder(Path(out_dir))  # before any work: an output that cannot be a folder is a one-line error
    res = results.load(experiment, batch=batch, run_ids=runs, baseline=baseline, tolerance=tolerance,
                       tracking_uri=tracking_uri, progress=progress, for_report=True,
                       include_overlapped=include_overlapped)  # fmt: skip
    ctx = ReportContext.of(res)
    covered = [b for b in ctx.batches if b] if log_artifact else []
    ctx.logged_to = {b: ctx.parents[b].info.run_id for b in covered if b in ctx.parents}
    report = write_report(ctx, out_dir, progress=progress)
    done = Exported(report, not_logged=[b for b in covered if b not in ctx.logged_to], asked=log_artifact)
    if ctx.logged_to:
        client = tracking.client(ctx.uri)
        for i, (b, rid) in enumerate(ctx.logged_to.items()):
            if progress is not None:
                progress(0.9 + 0.1 * i / len(ctx.logged_to), f"logging the report to the parent run of {b}")
            tracking.log_report(client, rid, Path(out_dir))  # + report.html MLflow can preview
            done.logged_to[b] = rid  # only once it is there: a failed upload leaves no false claim
    if progress is not None:
        progress(1.0, f"report written to {report}; {done.where()}")
    return done


def export_report(experiment: str, out_dir: str | Path, **kw: Any) -> Path:
    """:func:`export` (same keywords), returning only the report.md it wrote."""
    return export(experiment, out_dir, **kw).report
