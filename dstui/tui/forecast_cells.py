"""The memory-forecast column of the compose screen's run list, coloured against the GPU.

Called by the compose screen's validation worker (dstui/tui/compose_check.py, a
thread: the estimators import DeepSpeed, seconds the first time)::

    cells = forecast_cells(runs, ds_configs, sysmetrics.gpu_memory_total(), spec.gpu_memory_gib)

and shown in the run list's "mem/GPU" column (dstui/tui/widgets/run_preview.py).

History from MLflow is not read here (it changes between keystrokes rarely and
costs a store query); the analytic forecast is what a spec being edited gets.
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
    cells = {}
    for name, fc in forecast.forecast_runs(runs, ds_configs, history=False).items():
        cells[name] = Text(forecast.column(fc, capacity), style=LEVEL_STYLE[forecast.level(fc, capacity)])
    return cells
