"""Compose's slow check of a spec being edited: what `dstui run` would say about it, before launch.

The same checks as :func:`dstui.usecases.launch.make_plan` and :func:`~dstui.usecases.launch.check`,
on the runs Compose already expanded: every run's model can be loaded (a misspelt
``tiny-lama`` is named with the presets, and Compose marks the model field), DeepSpeed
accepts every config, the memory forecast (with MLflow's history, as the launch
forecasts) against the GPU, and what this machine cannot do. Slurm's preflight is
left to the launch (it submits test jobs). Never raises: a forecast that cannot be
made says why in its note; so does the predicted step time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dstui.analysis import forecast
from dstui.core.errors import SpecError
from dstui.execute import backends, feasibility, preflight, sysmetrics
from dstui.spec import dsconfig
from dstui.spec.experiment import RunSpec
from dstui.usecases.step_forecast import StepForecast, predict


@dataclass
class DraftCheck:
    error: str | None = None  # the first refusal, the CLI's SpecError text
    error_field: str | None = None  # the field it names ('model': Compose marks that row ✗)
    note: str = ""  # e.g. DeepSpeed is not installed here
    forecasts: dict[str, Any] = field(default_factory=dict)  # run name -> Forecast or None
    capacity: int | None = None
    memory_note: str = ""  # what the forecast was held against, or why there is none
    infeasible: dict[str, str] = field(default_factory=dict)  # run name -> 'deepcompile=true: why'
    machine: str = ""  # what they were held against: '1 GPU of 80 GiB, 16 CPU cores'
    steps: StepForecast = field(default_factory=StepForecast)  # predicted time per optimizer step


def validate(runs: list[RunSpec], file: str | None, spec_dir: Path) -> tuple[dict[str, dict] | None, SpecError | None, str]:
    """(ds configs or None, the refusal, a note): the models checked, then DeepSpeed's own validation."""
    try:
        preflight.check_models(runs, file=file)
        return dsconfig.build_and_validate(runs, file=file, spec_dir=spec_dir), None, ""
    except SpecError as e:
        if "not installed" in e.message:
            return None, None, "DeepSpeed not installed: config not checked"
        return None, e, ""


def memory(runs: Sequence[RunSpec], ds_configs: dict[str, dict] | None, declared_gib: float | None) -> tuple[dict[str, Any], int | None, str]:
    """(forecasts, capacity, what they were held against); never raises."""
    try:
        capacity = forecast.gpu_capacity(declared_gib, sysmetrics.gpu_memory_total())
        return forecast.forecast_runs(runs, ds_configs), capacity, forecast.capacity_note(capacity)
    except Exception as e:  # the forecast is advice: the run list and the DeepSpeed check stand without it
        return {}, None, f"memory forecast not available: {type(e).__name__}: {e}"


def check(runs: list[RunSpec], file: str | None, spec_dir: Path, declared_gib: float | None, executor: str = "local") -> DraftCheck:
    ds_configs, refused, note = validate(runs, file, spec_dir)
    forecasts, capacity, memory_note = memory(runs, ds_configs, declared_gib)
    machine = backends.get(executor).capacity()  # None: a scheduler places the runs (Slurm judges them itself)
    found = feasibility.problems(runs, machine)
    return DraftCheck(
        error=str(refused) if refused else None,
        error_field=refused.field if refused else None,
        note=note,
        forecasts=forecasts,
        capacity=capacity,
        memory_note=memory_note,
        infeasible={p.run: p.line().split(": ", 1)[1] for p in found},
        machine=machine.describe() if machine is not None else "",
        steps=predict(runs),
    )
