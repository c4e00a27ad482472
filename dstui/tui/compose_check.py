"""The compose screen's slow check, run in a thread worker (no textual here): what `dstui run`
would say about the spec being edited, coloured for the preview, with each run's predicted step time.

The checks are :func:`dstui.usecases.draft_check.check`'s (the models, DeepSpeed's config
validation, the memory forecast with history, this machine); they import DeepSpeed (seconds
the first time), so they never run on the UI thread. The forecast is held against the spec's
``gpu_memory_gib`` or else the GPU of this machine; on a box without a GPU it is shown
uncoloured with a note. A forecast that cannot be made (an unknown model, a broken install)
leaves the cells at '-' and says why: it never stops the check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.text import Text

from dstui.spec.experiment import RunSpec
from dstui.tui.forecast_cells import cells_of


@dataclass
class CheckResult:
    """What the preview shows once the check is done."""

    error: str | None = None  # the models or DeepSpeed refused (the CLI's SpecError text)
    note: str = ""  # e.g. DeepSpeed is not installed here
    memory: dict[str, Text] = field(default_factory=dict)  # run name -> '12.3 GiB', coloured
    memory_note: str = ""  # what the forecast was held against
    step_time: dict[str, Text] = field(default_factory=dict)  # run name -> '~34.1 ms' (the time model)
    time_note: str = ""  # what the time model was calibrated on
    infeasible: dict[str, str] = field(default_factory=dict)  # run name -> 'deepcompile=true: why' (this machine)
    machine: str = ""  # what they were held against: '1 GPU of 80 GiB, 16 CPU cores'
    error_field: str | None = None  # the settings field the error names ('model'): its row is marked ✗


def check(
    runs: list[RunSpec], file: str | None, spec_dir: Path, declared_gib: float | None, executor: str = "local"
) -> CheckResult:
    """Validate the models and configs, forecast memory with them (or without, when they are refused);
    and hold every run against this machine, as `dstui run` will."""
    from dstui.usecases import draft_check, step_forecast

    found = draft_check.check(runs, file, spec_dir, declared_gib, executor)
    memory = cells_of(found.forecasts, found.capacity)
    steps = {name: Text(step_forecast.column(p)) for name, p in found.steps.predictions.items()}
    return CheckResult(found.error, found.note, memory, found.memory_note, steps, found.steps.note,
                       found.infeasible, found.machine, found.error_field)  # fmt: skip
