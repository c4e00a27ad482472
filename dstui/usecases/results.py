"""Loading results: runs -> histories -> statistics -> conditions -> baseline -> ratios, once for every face.

``dstui report`` (:mod:`dstui.usecases.report`), ``dstui compare`` and the
TUI's Results screen all come here, so they read MLflow the same way, group
the same runs into the same conditions (:mod:`dstui.analysis.grouping`) and
judge them against the same baseline (:mod:`dstui.analysis.results`). The faces
only render what they get.

Something asked for that does not exist (an experiment, a batch, run ids, a
baseline) is :class:`~dstui.report.found.NothingFound` (exit status 3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dstui.analysis.fetch import fetch_histories, find_batch_parent
from dstui.analysis.parity import default_tolerance
from dstui.analysis.results import Results, compute
from dstui.analysis.revision_compare import (
    METHOD,
    Comparison,
    RunSample,
    compare,
    samples_from_runs,
)
from dstui.analysis.rundata import Progress, ReportError, RunData
from dstui.analysis.stats import compute_run_stats
from dstui.analysis.system import fetch_system
from dstui.core import paths
from dstui.core.errors import DstuiError
from dstui.report import found
from dstui.report.found import NothingFound
from dstui.tracking import client as tracking


def _say(progress: Progress | None, frac: float, msg: str) -> None:
    if progress is not None:
        progress(frac, msg)


def load(
    experiment: str,
    *,
    batch: str | None = None,
    run_ids: Sequence[str] | None = None,
    baseline: str | None = None,
    tolerance: float | None = None,
    tracking_uri: str | None = None,
    progress: Progress | None = None,
    for_report: bool = False,
    include_overlapped: bool = False,
) -> Results:
    """The experiment's results (one batch, or given run ids); ``for_report`` adds system metrics and parents.

    Timings taken while another run shared the machine (tag ``dstui.overlapped``) feed no
    speed figure unless ``include_overlapped`` (:func:`dstui.analysis.stats.compute_run_stats`).
    """
    uri = tracking_uri or paths.tracking_uri()
    client = tracking.client(uri)
    _say(progress, 0.0, "searching runs")
    exp, runs = found.fetch_runs(client, experiment, batch=batch, run_ids=run_ids)
    return _complete(client, uri, exp, runs, batch=batch, baseline=baseline, tolerance=tolerance,
                     progress=progress, for_report=for_report, include_overlapped=include_overlapped)  # fmt: skip


def _complete(
    client: Any, uri: str, exp: Any, runs: list[RunData], *, batch: str | None, baseline: str | None,
    tolerance: float | None, progress: Progress | None, for_report: bool, include_overlapped: bool = False,
) -> Results:  # fmt: skip
    """Histories, statistics, grouping and judgement of runs already found."""
    _say(progress, 0.1, f"reading metric histories of {len(runs)} runs")
    method = fetch_histories(client, uri, runs, progress=progress)
    _say(progress, 0.6, "computing statistics")
    for r in runs:
        r.stats = compute_run_stats(r, include_overlapped=include_overlapped)
    if for_report:
        fetch_system(client, runs)
    try:
        res = compute(runs, baseline=baseline, tolerance=tolerance)
    except ReportError as e:  # a --baseline that names no condition: nothing found (exit 3)
        raise NothingFound(str(e)) from None
    res.experiment, res.exp, res.uri, res.method, res.batch = exp.name, exp, uri, method, batch
    res.include_overlapped = include_overlapped
    if for_report:
        for b in res.batches:
            parent = find_batch_parent(client, exp.experiment_id, b)
            if parent is not None:
                res.parents[b] = parent
    return res


# -- the TUI's Results screen ---------------------------------------------------


@dataclass
class Browse:
    """What the Results screen shows: the experiments to pick from, the batches of the one shown, its results."""

    experiment: str
    experiments: list[str]
    batches: list[str]
    uri: str
    results: Results | None = None


def browse(experiment: str | None, batch: str | None, *, tracking_uri: str | None = None) -> Browse:
    """Results of an experiment (the newest when ``experiment`` is not one), all batches or one."""
    uri = tracking_uri or paths.tracking_uri()
    client = tracking.client(uri)
    exps = sorted(
        (e for e in client.search_experiments() if e.name != "Default"),
        key=lambda e: e.last_update_time or e.creation_time or 0,
        reverse=True,
    )
    names = [e.name for e in exps]
    if not names:
        return Browse("", [], [], uri)
    if experiment not in names:
        experiment = names[0]
    try:
        exp, runs = found.fetch_runs(client, experiment)
    except ReportError:  # an experiment without dstui runs yet
        return Browse(experiment, names, [], uri)
    batches = sorted({r.batch for r in runs if r.batch}, reverse=True)
    if batch:
        runs = [r for r in runs if r.batch == batch]
    res = _complete(client, uri, exp, runs, batch=batch, baseline=None, tolerance=None, progress=None,
                    for_report=False)  # fmt: skip
    return Browse(experiment, names, batches, uri, res)


# -- `dstui compare`: revisions against a baseline revision ------------------------


@dataclass
class RevisionResults:
    """Each revision against the baseline revision, per condition, in one batch."""

    experiment: str
    batch: str
    baseline: str
    tolerance: float
    tolerance_basis: str
    samples: list[RunSample] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    method: str = METHOD


def compare_revisions(
    experiment: str, batch: str | None, baseline: str, *, loss_tol: float | None = None, tracking_uri: str | None = None
) -> RevisionResults:
    """One batch's revisions against ``baseline`` (the newest batch that ran it when ``batch`` is None).

    Raises NothingFound when the baseline revision has no run there, and a
    DstuiError when none of its runs finished with iteration times.
    """
    uri = tracking_uri or paths.tracking_uri()
    client = tracking.client(uri)
    exp, runs = found.fetch_runs(client, experiment, batch=batch)  # none there: NotFound, exit 3
    with_base = [r for r in runs if r.revision == baseline and r.started]
    if not with_base:
        raise NothingFound(_no_baseline(baseline, runs))
    if batch is None:
        batch = max(with_base, key=lambda r: r.start_time or 0).batch
        runs = [r for r in runs if r.batch == batch]
    res = _complete(client, uri, exp, runs, batch=batch, baseline=None, tolerance=None, progress=None,
                    for_report=False)  # fmt: skip
    tol, basis = (loss_tol, "given") if loss_tol is not None else default_tolerance(
        [c for c in res.conds if c.kind != "verify"])
    samples = samples_from_runs(res.started)
    comps = compare(samples, baseline, loss_tol=tol)
    if comps and not any(c.n_base for c in comps):
        n = sum(1 for s in samples if s.revision == baseline)
        raise DstuiError(f"no usable baseline: none of the {n} run(s) of revision '{baseline}' in batch {batch} "
                         "finished with iteration times")  # fmt: skip
    return RevisionResults(experiment, batch or "", baseline, tol, basis, samples, comps)


def _no_baseline(baseline: str, runs: list[RunData]) -> str:
    revs = sorted({r.revision for r in runs})
    return f"no runs of baseline revision '{baseline}' (revisions here: {', '.join(revs) or 'none'})"
