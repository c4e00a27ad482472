"""Where a batch's wall time went, per run, from the ``time/*`` metrics the supervisor logs.

The supervisor logs each run's breakdown (dstui.core.phases: launch, imports,
init, compile, steps, teardown, wall, step_share, step_time_sum) as MLflow
metrics ``time/<name>``. This module turns fetched runs into the table a
report or the TUI shows, and the batch's step share: the sum of its
optimizer steps' times over its wall time (first launch to last exit).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dstui.analysis.runs import RunData
from dstui.core.phases import SEGMENTS

PREFIX = "time/"
COLUMNS = (*SEGMENTS, "wall", "step_share")


def time_table(runs: Sequence[RunData]) -> Any:
    """A pandas DataFrame: one row per run that has a breakdown (index: label or run name), seconds per segment."""
    import pandas as pd

    rows = {}
    for run in runs:
        values = {c: run.metrics.get(PREFIX + c) for c in COLUMNS}
        if values["wall"] is None:
            continue  # started before phases were recorded, or never reached its runner
        rows[run.label or run.run_name] = values
    return pd.DataFrame.from_dict(rows, orient="index", columns=list(COLUMNS))


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
