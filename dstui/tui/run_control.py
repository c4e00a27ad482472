"""What the runs screen's keys do to batches, run in its thread workers (no textual here).

The same functions as the CLI (`dstui run`, `dstui cancel`, `dstui status`):
the TUI must launch, cancel, retry and take over exactly as the headless
commands do, with the same defaults.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dstui.core import paths
from dstui.core.rundir import BatchDir, RunDir, list_batches
from dstui.execute.gpu_share import AUTO

if TYPE_CHECKING:  # the spec models cost ~0.2 s to import: not on the TUI's start path
    from dstui.spec.loading import SpecDraft

MAX_BATCHES = 30
DRAFT_FILE = "spec.yaml"  # an edited, unsaved spec's copy beside the batch it launched
TAKEOVER_GRACE_S = 30.0
# `dstui run`'s --parallel default: as many runs at once as fit on disjoint GPUs of this box,
# one at a time without GPUs (dstui/execute/gpu_share.py)
DEFAULT_PARALLEL = AUTO


def supervised(b: BatchDir) -> bool:
    """Whether a live supervisor follows this unfinished batch."""
    if b.info().get("finalized"):
        return False
    from dstui.execute.supervisor import is_supervised  # lazily: not on the start path

    return is_supervised(b)


def launch(
    spec: Path,
    parallel: int,
    progress: Callable[[str], None],
    draft: SpecDraft | None = None,
    *,
    force: bool = False,
) -> tuple[BatchDir, int]:
    """Validate everything, lay out folders, detach a supervisor: (the batch, its number of runs).

    ``draft``: a spec edited in Compose and not saved. It runs as edited, and its text is
    written as ``spec.yaml`` in the batch folder (batch.json's ``spec_path`` names that copy,
    ``edited_from`` the file it came from); the user's file is never written by a launch.
    Runs that cannot work on this machine raise :class:`~dstui.execute.feasibility.InfeasibleRuns`
    (the screen asks whether to launch anyway: ``force``), as `dstui run` refuses them.
    """
    from dstui.analysis import forecast
    from dstui.execute import batch, feasibility, supervisor, sysmetrics
    from dstui.spec.loading import save_spec_text

    p = batch.plan(spec, progress=progress, data=draft.data if draft else None)
    forecasts, capacity = forecast.for_plan(p, sysmetrics.gpu_memory_total(), history=False)
    feasibility.refuse_infeasible(p, force=force, forecasts=forecasts, capacity=capacity,
                                  skip_predicted_oom=p.spec.skip_predicted_oom)  # fmt: skip
    b = batch.create(p, parallel=parallel)
    if draft is not None:
        copy = b.path / DRAFT_FILE
        save_spec_text(copy, draft.text)
        b.update_info(spec_path=str(copy), edited_from=str(draft.origin) if draft.origin else None)
    supervisor.spawn(b)
    return b, len(p.runs)


def cancel(rd: RunDir) -> None:
    from dstui.execute import supervisor

    supervisor.request_cancel(rd)


def unfinished(b: BatchDir) -> list[RunDir]:
    """The runs of a batch that a cancel would stop (queued, starting, running)."""
    from dstui.core.rundir import FINAL_STATES

    return [rd for rd in b.runs() if rd.state not in FINAL_STATES]


def cancel_batch(b: BatchDir) -> list[RunDir]:
    """Cancel every unfinished run of a batch, as `dstui cancel BATCH` does; returns them."""
    runs = unfinished(b)
    for rd in runs:
        cancel(rd)
    return runs


def retry(rd: RunDir, notify: Callable[[str], None]) -> None:
    """Queue a failed/killed run again (its old attempt is kept) and make sure someone supervises it."""
    from dstui.execute import batch, supervisor

    batch.retry(rd)
    notify(f"queued again: {rd.name} (old attempt kept)")
    # a supervisor that was just finishing the batch may exit without seeing the
    # re-queued run; make sure someone picks it up
    for _ in range(20):
        time.sleep(0.5)
        if rd.state != "queued":
            return
    if not supervisor.is_supervised(rd.batch):
        supervisor.spawn(rd.batch)


def take_over() -> tuple[dict[str, bool], list[str]]:
    """Restart supervisors of unfinished batches (leave and come back): (live batch ids, restarted ids)."""
    from dstui.execute import supervisor

    live: dict[str, bool] = {}
    restarted = []
    for b in list_batches(paths.runs_dir())[:MAX_BATCHES]:
        info = b.info()
        if info.get("finalized") and b.is_finished():
            continue
        if time.time() - info.get("created", 0) < TAKEOVER_GRACE_S:
            continue  # just launched (e.g. by `dstui demo`): its supervisor may still be starting
        if supervisor.ensure_supervised(b):
            restarted.append(b.id)
        live[b.id] = True
    return live, restarted
