"""The compose screen's slow check, run in a thread worker: DeepSpeed's config validation,
the memory forecast and the predicted step time per run (no textual here).

Both import DeepSpeed (seconds the first time), so neither may run on the UI
thread. The forecast is DeepSpeed's model-state estimators plus the analytic
activation estimate (dstui/analysis/forecast.py), held against the spec's
``gpu_memory_gib`` or else the GPU of this machine; on a box without a GPU it
is shown uncoloured with a note. A forecast that cannot be made (an unknown
model, a broken install) leaves the cells at '-' and says why: it never
stops the check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.text import Text

from dstui.core.errors import SpecError
from dstui.spec.models import RunSpec


@dataclass
class CheckResult:
    """What the preview shows once the check is done."""

    error: str | None = None  # DeepSpeed refused a config (the CLI's SpecError text)
    note: str = ""  # e.g. DeepSpeed is not installed here
    memory: dict[str, Text] = field(default_factory=dict)  # run name -> '12.3 GiB', coloured
    memory_note: str = ""  # what the forecast was held against
    step_time: dict[str, Text] = field(default_factory=dict)  # run name -> '~34.1 ms' (the time model)
    time_note: str = ""  # what the time model was calibrated on
    infeasible: dict[str, str] = field(default_factory=dict)  # run name -> 'deepcompile=true: why' (this machine)
    machine: str = ""  # what they were held against: '1 GPU of 80 GiB, 16 CPU cores'


def validate(runs: list[RunSpec], file: str | None, spec_dir: Path) -> tuple[dict[str, dict] | None, str | None, str]:
    """(ds configs by run name or None, error, note): DeepSpeed's own validation of every config."""
    from dstui.spec import dsconfig

    try:
        return dsconfig.build_and_validate(runs, file=file, spec_dir=spec_dir), None, ""
    except SpecError as e:
        if "not installed" in e.message:
            return None, None, "DeepSpeed not installed: config not checked"
        return None, str(e), ""


def memory_cells(runs: Sequence[RunSpec], ds_configs: dict[str, dict] | None, declared_gib: float | None) -> tuple[dict[str, Text], str]:
    """(run name -> forecast cell, a line saying what it was held against); never raises."""
    try:
        from dstui.analysis import forecast
        from dstui.execute import sysmetrics
        from dstui.tui.forecast_cells import forecast_cells

        detected = sysmetrics.gpu_memory_total()
        cells = forecast_cells(runs, ds_configs, detected, declared_gib)
        return cells, forecast.capacity_note(forecast.gpu_capacity(declared_gib, detected))
    except Exception as e:  # the forecast is advice: the run list and the DeepSpeed check stand without it
        return {}, f"memory forecast not available: {type(e).__name__}: {e}"


def time_cells(runs: Sequence[RunSpec]) -> tuple[dict[str, Text], str]:
    """(run name -> predicted step time, what the model was calibrated on); never raises.

    The model of this machine (its GPU, or this host's CPU ranks), calibrated on the finished runs
    of the same machine in the local MLflow store (a SQLite query, no mlflow import).
    """
    try:
        from dstui.analysis import time_forecast
        from dstui.execute import sysmetrics

        gpus = sysmetrics.gpu_count()
        model = time_forecast.for_machine("cuda" if gpus else "cpu", sysmetrics.gpu_name() if gpus else None)
        cells = {name: Text(time_forecast.column(p)) for name, p in time_forecast.predict_runs(runs, model).items()}
        return cells, f"step: predicted time per optimizer step ({model.source}, {time_forecast.machine_words(model.hardware)})"
    except Exception as e:  # advice, like the memory forecast: the check stands without it
        return {}, f"step time prediction not available: {type(e).__name__}: {e}"


def machine_problems(runs: Sequence[RunSpec], executor: str = "local") -> tuple[dict[str, str], str]:
    """(run name -> why it cannot work here, the machine in words): the check `dstui run` refuses by."""
    from dstui.execute import backends, feasibility

    machine = backends.get(executor).capacity()  # None: a scheduler places the runs (Slurm judges them itself)
    found = feasibility.problems(runs, machine)
    return {p.run: p.line().split(": ", 1)[1] for p in found}, machine.describe() if machine is not None else ""


def check(
    runs: list[RunSpec], file: str | None, spec_dir: Path, declared_gib: float | None, executor: str = "local"
) -> CheckResult:
    """Validate the configs, then forecast memory with them (or without, when they are refused);
    and hold every run against this machine, as `dstui run` will."""
    ds_configs, error, note = validate(runs, file, spec_dir)
    memory, memory_note = memory_cells(runs, ds_configs, declared_gib)
    steps, time_note = time_cells(runs)
    infeasible, machine = machine_problems(runs, executor)
    return CheckResult(error, note, memory, memory_note, steps, time_note, infeasible, machine)
