"""Where a batch's wall time went, per run, from the ``time/*`` metrics the supervisor logs.

The supervisor logs each run's breakdown (dstui.core.phases: launch, imports,
init, compile, steps, teardown, wall, step_share, step_time_sum) as MLflow
metrics ``time/<name>``. This module turns fetched runs into the table a
report or the TUI shows, and the batch's step share: the sum of its
optimizer steps' times over its wall time (first launch to last exit).
Runs without ``time/*`` metrics (imported seed logs, runs from before phase
times were recorded, runs that never reached their runner) have no row.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from dstui.analysis.rundata import RunData
from dstui.core.phases import SEGMENTS

PREFIX = "time/"
COLUMNS = (*SEGMENTS, "wall", "step_share")


def has_breakdown(run: RunData) -> bool:
    """Whether the supervisor logged this run's time breakdown (its wall time at least)."""
    return run.metrics.get(PREFIX + "wall") is not None


def row_names(runs: Sequence[RunData]) -> dict[str, str]:
    """A unique row name per run id: the run name, with its batch where two batches share names.

    Repeats of a condition share its label, so rows are named after runs
    (``z1-r0``, ``z1-r1``), not conditions.
    """
    counts = Counter(r.run_name for r in runs)
    return {r.run_id: r.run_name if counts[r.run_name] == 1 else f"{r.run_name} ({r.batch or r.run_id[:8]})" for r in runs}


def time_table(runs: Sequence[RunData]) -> Any:
    """A pandas DataFrame: one row per run that has a breakdown (index: its row name), seconds per segment."""
    import pandas as pd

    names = row_names(runs)
    rows = {names[r.run_id]: {c: r.metrics.get(PREFIX + c) for c in COLUMNS} for r in runs if has_breakdown(r)}
    return pd.DataFrame.from_dict(rows, orient="index", columns=list(COLUMNS)).astype(float)


def batch_step_share(runs: Sequence[RunData]) -> tuple[float, float, float] | None:
    """(share, sum of step times, wall seconds) over the runs' span; None without breakdowns.

    The span runs from the first run's start to the last run's end (start +
    its wall time); runs that shared the box on disjoint GPUs overlap in it.
    """
    spans = []
    step_sum = 0.0
    for run in runs:
        wall = run.metrics.get(PREFIX + "wall")
        steps = run.metrics.get(PREFIX + "step_time_sum")
        if wall is None or steps is None or run.start_time is None:
            continue
        start = run.start_time / 1000.0
        spans.append((start, start + wall))
        step_sum += steps
    if not spans:
        return None
    wall = max(e for _, e in spans) - min(s for s, _ in spans)
    return (step_sum / wall if wall > 0 else 0.0), step_sum, wall


def step_share_by_batch(runs: Sequence[RunData]) -> dict[str, tuple[float, float, float]]:
    """:func:`batch_step_share` per batch id: one report may span batches days apart, whose gap is no one's wall time."""
    batches: dict[str, list[RunData]] = {}
    for r in runs:
        batches.setdefault(r.batch, []).append(r)
    return {b: share for b, rs in batches.items() if (share := batch_step_share(rs)) is not None}
