"""The predicted time per optimizer step of each run, for `dstui list`, Compose and `dstui tune`.

One place so both faces say the same number: the time model of this machine
(its GPU, or this host's CPU ranks; :mod:`dstui.analysis.time_forecast`),
calibrated on the finished runs of the same machine in the local MLflow store.
Advice, like the memory forecast: it never stops a check, it says why it is missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dstui.spec.experiment import RunSpec


@dataclass
class StepForecast:
    predictions: dict[str, Any] = field(default_factory=dict)  # run name -> time_forecast prediction
    note: str = ""  # what the model was calibrated on, or why there is none


def predict(runs: Sequence[RunSpec], *, history: bool = True) -> StepForecast:
    """Each run's predicted step time on this machine; never raises."""
    try:
        from dstui.analysis import time_forecast
        from dstui.execute import sysmetrics

        gpus = sysmetrics.gpu_count()
        model = time_forecast.for_machine("cuda" if gpus else "cpu", sysmetrics.gpu_name() if gpus else None,
                                          use_history=history)  # fmt: skip
        note = f"step: predicted time per optimizer step ({model.source}, {time_forecast.machine_words(model.hardware)})"
        return StepForecast(time_forecast.predict_runs(list(runs), model), note)
    except Exception as e:  # advice: the run list and the other checks stand without it
        return StepForecast({}, f"step time prediction not available: {type(e).__name__}: {e}")


def column(prediction: Any) -> str:
    """The cell a table shows for one prediction ('~34.1 ms'; '-' for none)."""
    from dstui.analysis import time_forecast

    return time_forecast.column(prediction) if prediction is not None else "-"
