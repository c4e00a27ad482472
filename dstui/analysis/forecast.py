"""Peak GPU memory per condition, forecast before launch; and how good it was, after.

``forecast = max(states held through forward + activations, model states at the step)
+ framework overhead`` (the parts are in :mod:`dstui.analysis.forecast_model`). Activations come from
a least-squares fit on earlier GPU runs of the same model in MLflow when there
are enough of them (:class:`ActivationFit`), else from the analytic estimate.
The fit's inputs are those the issue names: sequence length, micro batch,
dtype (bytes per element) and activation checkpointing (its own fit).

Memory is in bytes; shown in GiB (bytes / 2**30).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dstui.analysis import forecast_history
from dstui.analysis.forecast_history import HistoryRun
from dstui.analysis.forecast_model import (
    DTYPE_BYTES,
    GIB,
    ModelShape,
    analytic_activations,
    forward_free,
    framework_overhead,
    model_shape,
    model_states,
    step_extra,
)
from dstui.spec.settings import Settings
from dstui.tracking import metric_names
from dstui.tracking import tags as tag_keys

# a fit needs at least this many distinct (seq, micro batch, dtype) points, and one more than
# its free coefficients
MIN_FIT_POINTS = 3


@dataclass(frozen=True)
class Forecast:
    """Peak memory per GPU of one condition, in bytes, and where the activation part came from.

    ``forward_free``: the states that do not exist yet during forward (the
    gradients); ``step_extra``: what the optimizer step adds. The peak is the
    larger of the two moments.
    """

    model_states: int
    activations: int
    overhead: int
    source: str  # "analytic" or "fit on N runs"
    forward_free: int = 0
    step_extra: int = 0

    @property
    def forward_peak(self) -> int:
        return self.model_states - self.forward_free + self.activations + self.overhead

    @property
    def step_peak(self) -> int:
        return self.model_states + self.step_extra + self.overhead

    @property
    def total(self) -> int:
        return max(self.forward_peak, self.step_peak)

    @property
    def gib(self) -> float:
        return self.total / GIB

    def label(self) -> str:
        return f"{self.gib:.1f} GiB"


def features(seq_length: int, micro_batch: int, dtype: str) -> list[float]:
    """Least-squares inputs: a constant, bytes linear in tokens, and attention's s^2 term."""
    e = DTYPE_BYTES.get(dtype, 4)
    return [1.0, float(seq_length * micro_batch * e), float(seq_length**2 * micro_batch * e)]


def group_of(settings: Settings) -> str:
    """The ZeRO set-up a run belongs to: the part of its memory no formula here gets exactly."""
    return f"z{settings.zero_stage}-{settings.offload}-{settings.offload_params}-dc{int(settings.deepcompile)}"


@dataclass
class ActivationFit:
    """Activation bytes ~ c0 + c1 * s*b*e + c2 * s^2*b*e, per (model, checkpointing).

    ``observations`` are (model, checkpointing, group, seq, micro batch,
    dtype, activation bytes), where activation bytes = measured peak - model
    states - overhead of an earlier GPU run, and group is :func:`group_of`.
    A fit on the runs of the same ZeRO set-up is preferred (what DeepSpeed
    keeps alive beside the activations differs by stage, and DeepCompile
    frees activations early); with too few of them, all of the model's runs
    are pooled and the set-up's own runs, if any, shift the pooled line by
    their mean residual.
    """

    observations: list[tuple[str, bool, str, int, int, str, float]] = field(default_factory=list)
    _coef: dict[tuple[str, bool, str | None], tuple[Any, int] | None] = field(default_factory=dict)

    def add(self, model: str, checkpointing: bool, group: str, seq: int, mb: int, dtype: str, act: float) -> None:
        self.observations.append((model, checkpointing, group, seq, mb, dtype, act))
        self._coef.clear()

    def coefficients(self, model: str, checkpointing: bool, group: str | None = None) -> tuple[Any, int] | None:
        """(c0, c1, c2) and the number of runs, or None with too few distinct points."""
        import numpy as np

        key = (model, checkpointing, group)
        if key not in self._coef:
            rows = [o for o in self.observations if o[:2] == (model, checkpointing) and group in (None, o[2])]
            distinct = {o[3:6] for o in rows}
            x = np.array([features(s, b, d) for *_, s, b, d, _ in rows]).reshape(-1, 3)
            # one point more than the fit has free coefficients (a fixed sequence length leaves
            # two: the linear and quadratic columns are then proportional), so it can be wrong
            rank = np.linalg.matrix_rank(x / x.max(axis=0)) if rows else 0
            if len(distinct) <= rank or len(distinct) < MIN_FIT_POINTS:
                self._coef[key] = None
            else:
                coef, *_ = np.linalg.lstsq(x, np.array([o[-1] for o in rows]), rcond=None)
                self._coef[key] = (coef, len(rows))
        return self._coef[key]

    def predict(self, settings: Settings) -> tuple[int, int] | None:
        """(activation bytes, runs fitted on), or None when this model has too little history."""
        s = settings
        group = group_of(s)
        own = self.coefficients(s.model, s.activation_checkpointing, group)
        got = own or self.coefficients(s.model, s.activation_checkpointing)
        if got is None:
            return None
        coef, n = got
        value = _apply(coef, s.seq_length, s.micro_batch, s.dtype)
        if own is None:  # pooled fit, shifted by how this ZeRO set-up's own runs sat against it
            mine = [o for o in self.observations if o[:3] == (s.model, s.activation_checkpointing, group)]
            if mine:
                value += sum(o[-1] - _apply(coef, *o[3:6]) for o in mine) / len(mine)
        return max(0, int(value)), n


def _apply(coef: Any, seq: int, mb: int, dtype: str) -> float:
    return float(sum(c * f for c, f in zip(coef, features(seq, mb, dtype), strict=True)))


def _parts(shape: ModelShape, s: Settings, ds_config: dict | None) -> Forecast:
    """Every part but the activations (0 here; source empty)."""
    layout = {"zero_stage": s.zero_stage, "offload": s.offload, "offload_params": s.offload_params,
              "dtype": s.dtype, "gpus": s.gpus, "nodes": s.nodes}  # fmt: skip
    return Forecast(
        model_states=model_states(shape, **layout),
        activations=0,
        overhead=framework_overhead(
            shape, zero_stage=s.zero_stage, dtype=s.dtype, ds_config=ds_config, ranks=s.gpus * s.nodes
        ),
        source="",
        forward_free=forward_free(shape, **layout),
        step_extra=step_extra(shape, zero_stage=s.zero_stage, dtype=s.dtype),
    )


def forecastable_shape(settings: Settings) -> ModelShape | None:
    """The shape a forecast of this run starts from; None when there is nothing to forecast.

    A ``kind: command`` run is the user's own program; a hub model's shape is unknown offline.
    """
    return None if settings.kind == "command" else model_shape(settings.model)


def forecast(settings: Settings, *, ds_config: dict | None = None, fit: ActivationFit | None = None) -> Forecast | None:
    """Peak memory per GPU for one condition; None when there is nothing to forecast (:func:`forecastable_shape`)."""
    shape = forecastable_shape(settings)
    if shape is None:
        return None
    parts = _parts(shape, settings, ds_config)
    s = settings
    fitted = fit.predict(s) if fit else None
    if fitted is not None:
        act, n = fitted
        return dataclasses.replace(parts, activations=act, source=f"fit on {n} runs")
    act = analytic_activations(
        shape,
        seq_length=s.seq_length,
        micro_batch=s.micro_batch,
        dtype=s.dtype,
        checkpointing=s.activation_checkpointing,
        sequence_parallel=s.sequence_parallel,
    )
    return dataclasses.replace(parts, activations=act, source="analytic")


# -- history from MLflow ------------------------------------------------------


def settings_of(params: dict[str, Any]) -> Settings | None:
    """A run's Settings rebuilt from its MLflow params (or a header's config); None if invalid."""
    from pydantic import ValidationError

    from dstui.analysis.rundata import parse_value

    def value(v: Any) -> Any:  # MLflow keeps every param as text: "2" -> 2, but "none" stays a name
        parsed = parse_value(v) if isinstance(v, str) else v
        return v if parsed is None else parsed

    known = {k: value(v) for k, v in params.items() if k in Settings.model_fields and v not in ("", None)}
    for name in ("ds_overrides", "env", "launcher", "command", "extra_args"):
        known.pop(name, None)
    try:
        return Settings.model_validate(known)
    except ValidationError:
        return None


def observe(fit: ActivationFit, settings: Settings, peak_bytes: float, ds_config: dict | None = None) -> bool:
    """Add one measured GPU run to a fit; False when its model's shape is unknown.

    A peak no higher than the optimizer step's (small micro batches) says
    nothing about the activations: such a run is left out (False).
    """
    shape = model_shape(settings.model)
    if shape is None or not peak_bytes:
        return False
    parts = _parts(shape, settings, ds_config)
    if peak_bytes <= parts.step_peak * 1.02:
        return False
    s = settings
    act = peak_bytes - parts.forward_peak
    fit.add(s.model, s.activation_checkpointing, group_of(s), s.seq_length, s.micro_batch, s.dtype, act)
    return True


def history_fit(client: Any, models: Iterable[str]) -> ActivationFit:
    """Fit activations on every finished GPU run in MLflow of the given models.

    Only ``dstui.device = cuda`` runs: on CPU ``mem_peak`` is the process RSS,
    not accelerator memory. A store that cannot be read gives an empty fit.
    """
    runs = []
    exps = [e.experiment_id for e in client.search_experiments()]
    for model in sorted(set(models)):
        lit = model.replace("'", "")
        filt = f"{tag_keys.RUN_FILTER} and {tag_keys.search(tag_keys.DEVICE)} = 'cuda' and params.model = '{lit}'"
        for run in client.search_runs(exps, filter_string=filt, max_results=5000) if exps else []:
            runs.append(HistoryRun(dict(run.data.params), dict(run.data.metrics), dict(run.data.tags)))
    return fit_of(runs)


def fit_of(runs: Iterable[HistoryRun]) -> ActivationFit:
    """The activation fit on these GPU runs (MLflow's search, or the SQLite store read directly)."""
    fit = ActivationFit()
    for run in runs:
        metrics = metric_names.metrics_from_mlflow(run.metrics)  # bytes, whichever name MLflow holds them under
        peak = metrics.get("summary.mem_peak_max") or metrics.get("mem_peak")
        settings = settings_of(run.params)
        if settings is None or not peak or run.tags.get(tag_keys.STATUS) not in (None, "done"):
            continue
        observe(fit, settings, peak, zero_config_of(run.params))
    return fit


def stored_fit(uri: str, models: Iterable[str]) -> ActivationFit:
    """The fit on the store at ``uri``: a local SQLite file read directly (no mlflow import), else MLflow's client."""
    models = list(models)
    db = forecast_history.sqlite_file(uri)
    runs = forecast_history.read_runs(db, models) if db is not None else None
    if runs is not None:
        return fit_of(runs)
    from dstui.tracking import client as tracking

    return history_fit(tracking.client(uri), models)


def zero_config_of(params: dict[str, str]) -> dict[str, Any]:
    """The zero_optimization keys the overhead reads, back from the flattened ``ds.*`` params."""
    zero: dict[str, Any] = {}
    for key, value in params.items():
        if key.startswith("ds.zero_optimization."):
            try:
                zero[key.rsplit(".", 1)[1]] = int(float(value))
            except ValueError:
                continue
    return {"zero_optimization": zero}


@contextlib.contextmanager
def _fail_fast() -> Iterator[None]:
    """One try, 10 s at most, against a tracking server: a forecast must not hold up a launch."""
    keys = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
    old = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: v for k, v in keys.items() if old[k] is None})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)


def forecast_runs(
    runs: Sequence[Any],
    ds_configs: dict[str, dict] | None = None,
    *,
    tracking_uri: str | None = None,
    history: bool = True,
) -> dict[str, Forecast | None]:
    """A forecast per run name for a plan (``RunSpec`` list), with MLflow history when reachable."""
    fit = None
    # only a run with a forecast can use what MLflow measured: a batch of the user's own commands
    # (or unknown models) skips the store, and with it ~2 CPU-s of mlflow import
    if history and any(forecastable_shape(r.settings) for r in runs):
        from dstui.core import paths

        uri = tracking_uri or paths.tracking_uri()
        # a SQLite store that does not exist yet holds no history: don't create (migrate) one here
        if not (uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file()):
            try:
                with _fail_fast():
                    fit = stored_fit(uri, (r.settings.model for r in runs))
            except Exception:  # unreachable store: the analytic estimate still works
                fit = None
    return {r.name: forecast(r.settings, ds_config=(ds_configs or {}).get(r.name), fit=fit) for r in runs}


# -- against the GPU's memory -------------------------------------------------


def gpu_capacity(declared_gib: float | None, detected: int | None) -> int | None:
    """The memory a forecast is held against: the spec's ``gpu_memory_gib``, else the GPU found here."""
    return int(declared_gib * GIB) if declared_gib else detected


def oom_reason(fc: Forecast | None, capacity: int | None) -> str | None:
    """``skipped: predicted OOM (X GiB > Y GiB)`` when the forecast exceeds the GPU, else None."""
    if fc is None or not capacity or fc.total <= capacity:
        return None
    return f"skipped: predicted OOM ({fc.gib:.1f} GiB > {capacity / GIB:.1f} GiB)"


def level(fc: Forecast | None, capacity: int | None) -> str:
    """'ok', 'tight' (above 90% of the GPU), 'oom' or 'unknown': for colouring a column."""
    if fc is None or not capacity:
        return "unknown"
    if fc.total > capacity:
        return "oom"
    return "tight" if fc.total > 0.9 * capacity else "ok"


def column(fc: Forecast | None, capacity: int | None = None) -> str:
    """The text of a forecast column: '12.3 GiB', with '!' near and 'OOM' over the GPU's memory."""
    if fc is None:
        return "-"
    mark = {"oom": " OOM", "tight": " !"}.get(level(fc, capacity), "")
    return fc.label() + mark


def for_plan(plan: Any, detected: int | None, *, history: bool = True) -> tuple[dict[str, Forecast | None], int | None]:
    """Forecasts of a :class:`dstui.execute.batch.Plan`'s runs and the memory to hold them against.

    ``detected``: this machine's GPU memory (``sysmetrics.gpu_memory_total()``), which
    the spec's ``gpu_memory_gib`` overrides (a plan made on a login node).
    """
    forecasts = forecast_runs(plan.runs, plan.ds_configs, history=history)
    return forecasts, gpu_capacity(plan.spec.gpu_memory_gib, detected)


def capacity_note(capacity: int | None) -> str:
    """A line saying what forecasts were held against."""
    if capacity:
        return f"memory forecast per GPU against {capacity / GIB:.1f} GiB"
    return "memory forecast per GPU (no GPU here and no gpu_memory_gib in the spec: not checked for OOM)"
