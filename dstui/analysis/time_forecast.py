"""Predicted step time per run before launch, calibrated on this machine's history in MLflow.

The time model's terms (:mod:`dstui.analysis.time_model`) are hardware costs,
not a model's: every finished training run of the same machine kind (the same
GPU model, or on CPUs the same host) calibrates them, whatever model it trained.
The runs are read as the memory forecast reads its own: a local SQLite store
directly (:func:`dstui.analysis.forecast_history.read_matching`), anything else
through MLflow's client; an unreadable store leaves the first-principles prior.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from dstui.analysis import forecast_history
from dstui.analysis.forecast import forecastable_shape, settings_of
from dstui.analysis.forecast_history import HistoryRun
from dstui.analysis.time_fit import Observation, Prediction, TimeModel
from dstui.analysis.time_model import Hardware, hardware_for, terms
from dstui.spec.settings import Settings
from dstui.tracking import tags as tag_keys

MAX_HISTORY = 500  # the newest runs of the machine kind; older ones add little and cost a fit's time


def hardware_tags(hw: Hardware) -> dict[str, str]:
    """The tags a run of this machine kind carries (``dstui.device`` and GPU name, or host on CPUs)."""
    device, _, name = hw.kind.partition(":")
    key = tag_keys.GPU_NAME if device == "cuda" else tag_keys.HOSTNAME
    return {tag_keys.ROLE: tag_keys.ROLE_RUN, tag_keys.DEVICE: device, key: name}


def rel_sd_of(metrics: dict[str, float]) -> float:
    """Relative standard error of a run's mean step time from its summary (std over the timed steps)."""
    mean = metrics.get("summary.iter_time_mean")
    std = metrics.get("summary.iter_time_std") or 0.0
    steps = (metrics.get("summary.steps") or 0) - (metrics.get("summary.warmup_steps") or 0)
    if not mean or steps < 2 or not math.isfinite(std):
        return 0.05
    return std / mean / math.sqrt(steps)


def observation_of(settings: Settings, seconds: float, rel_sd: float, hw: Hardware, source: str = "") -> Observation | None:
    """A measured step time as the fit takes it; None for a run whose model shape is unknown here."""
    shape = forecastable_shape(settings)
    if shape is None or not seconds or not math.isfinite(seconds) or seconds <= 0:
        return None
    return Observation(terms(settings, shape, hw), float(seconds), max(0.0, rel_sd), source)


def observations_of(runs: Iterable[HistoryRun], hw: Hardware) -> list[Observation]:
    out = []
    for run in runs:
        if run.tags.get(tag_keys.STATUS) not in (None, "done") or run.params.get("kind", "train") != "train":
            continue
        settings = settings_of(run.params)
        mean = run.metrics.get("summary.iter_time_mean")
        if settings is None or mean is None:
            continue
        found = observation_of(settings, mean, rel_sd_of(run.metrics), hw, run.tags.get(tag_keys.BATCH, ""))
        if found is not None:
            out.append(found)
    return out[:MAX_HISTORY]


def history(uri: str, hw: Hardware) -> list[Observation]:
    """This machine kind's finished runs in the store at ``uri`` (SQLite read directly; else MLflow's client)."""
    wanted = hardware_tags(hw)
    db = forecast_history.sqlite_file(uri)
    if db is not None and not db.is_file():
        return []  # a store that does not exist yet holds no history: don't create one here
    runs = forecast_history.read_matching(db, [(wanted, {})]) if db is not None else None
    if runs is None:
        from dstui.tracking import client as tracking

        c = tracking.client(uri)
        exps = [e.experiment_id for e in c.search_experiments()]
        filt = " and ".join(f"{tag_keys.search(k)} = '{v.replace(chr(39), '')}'" for k, v in wanted.items())
        found = c.search_runs(exps, filter_string=filt, max_results=MAX_HISTORY) if exps else []
        runs = [HistoryRun(dict(r.data.params), dict(r.data.metrics), dict(r.data.tags)) for r in found]
    return observations_of(runs, hw)


def model_for(hw: Hardware, *, uri: str | None = None, use_history: bool = True) -> TimeModel:
    """The time model of this machine kind, fitted on its history when asked and readable."""
    found: list[Observation] = []
    if use_history:
        from dstui.core import paths

        try:
            found = history(uri or paths.tracking_uri(), hw)
        except Exception:  # an unreachable or foreign store: the prior still predicts
            found = []
    return TimeModel(hw, found).fit()


def predict_runs(runs: Sequence[Any], model: TimeModel) -> dict[str, Prediction | None]:
    """A prediction per run name of a plan (``RunSpec`` list); None for a command or an unknown model."""
    out: dict[str, Prediction | None] = {}
    for r in runs:
        shape = forecastable_shape(r.settings)
        out[r.name] = model.predict(terms(r.settings, shape, model.hardware)) if shape else None
    return out


def for_machine(device: str, gpu_name: str | None, *, history_uri: str | None = None, use_history: bool = True) -> TimeModel:
    """The model for the machine the caller runs on (``device`` cuda/cpu and its GPU's name)."""
    import platform

    return model_for(hardware_for(device, gpu_name, platform.node()), uri=history_uri, use_history=use_history)


def machine_words(hw: Hardware) -> str:
    """'NVIDIA H100 80GB HBM3' or 'this host's CPU ranks': what a prediction is for, in words."""
    device, _, name = hw.kind.partition(":")
    return name if device == "cuda" else "this host's CPU ranks"


def column(p: Prediction | None) -> str:
    """A table cell: '~34.1 ms' (a prediction is never a measurement), '-' when none."""
    return "-" if p is None else f"~{p.label()}"


