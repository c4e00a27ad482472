"""The memory-forecast column of the compose screen's run list, coloured against the GPU.

The compose screen's validation worker (dstui/tui/compose_check.py, a thread: the
estimators import DeepSpeed, seconds the first time) turns the forecasts of
:func:`dstui.usecases.draft_check.check` (with MLflow's history, as the launch
forecasts) into :func:`cells_of`, shown in the run list's "mem/GPU" column
(dstui/tui/widgets/run_preview.py). :func:`forecast_cells` is the analytic
forecast alone, for a list of runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text

from dstui.analysis import forecast

LEVEL_STYLE = {"ok": "green", "tight": "bold yellow", "oom": "bold red", "unknown": ""}


def forecast_cells(
    runs: Sequence[Any],
    ds_configs: dict[str, dict] | None,
    detected: int | None,
    declared_gib: float | None = None,
) -> dict[str, Text]:
    """Run name -> '12.3 GiB' styled green / yellow (above 90%) / red (over) against the GPU's memory."""
    capacity = forecast.gpu_capacity(declared_gib, detected)
    return cells_of(forecast.forecast_runs(runs, ds_configs, history=False), capacity)


def cells_of(forecasts: dict[str, Any], capacity: int | None) -> dict[str, Text]:
    """Run name -> its forecast's cell, styled by how it fits ``capacity``."""
    return {name: Text(forecast.column(fc, capacity), style=LEVEL_STYLE[forecast.level(fc, capacity)])
            for name, fc in forecasts.items()}  # fmt: skip
