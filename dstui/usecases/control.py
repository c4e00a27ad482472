"""Cancelling and retrying runs: what `dstui cancel`/`dstui retry` and the TUI's c, C and r do.

One function per action, so the keys and the commands cannot drift: a cancel
writes the run's request and, where it can, kills at once (a Slurm job is
scancel'led); a retry queues failed, killed or skipped runs again (a done one
only with ``force``), keeping the old attempt, and leaves each batch with a
supervisor by the takeover rule (:func:`dstui.usecases.takeover.after_requeue`).
"""

from __future__ import annotations

from dstui.core.rundir import FINAL_STATES, BatchDir, RunDir
from dstui.execute import batch, control
from dstui.usecases import takeover


def unfinished(b: BatchDir) -> list[RunDir]:
    """The runs of a batch that a cancel would stop (queued, starting, running)."""
    return [rd for rd in b.runs() if rd.state not in FINAL_STATES]


def cancel(runs: list[RunDir]) -> tuple[list[RunDir], list[RunDir]]:
    """Cancel every run that has not ended: (cancelled, already ended and left as they are)."""
    cancelled, ended = [], []
    for rd in runs:
        if rd.state in FINAL_STATES:
            ended.append(rd)
            continue
        control.request_cancel(rd)
        cancelled.append(rd)
    return cancelled, ended


def requeue(runs: list[RunDir], *, force: bool = False) -> list[RunDir]:
    """Queue each run again (its old attempt kept), then make sure each batch is supervised (once per batch).

    Raises :class:`~dstui.core.errors.DstuiError` for a run that has not ended, or
    a done one without ``force`` (callers check all runs first: all or nothing).
    """
    batches: dict[str, BatchDir] = {}
    for rd in runs:
        batch.retry(rd, force=force)
        batches[rd.batch.id] = rd.batch
    for b in batches.values():
        takeover.after_requeue(b)
    return runs
