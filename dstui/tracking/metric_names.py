"""The names and units a metric has in MLflow, and back: one mapping for every writer and reader.

Records (runners' ``metrics.jsonl``, ``status.json``, reports) keep memory in
bytes and a run's time breakdown as ``time/<phase>``. MLflow shows what it is
given as it is: a peak of ``520000000`` on an axis of bytes, and a ``time/*``
prefix becomes a chart section that MLflow's UI puts above every other
(custom sections first, then "Model metrics", then "System metrics"), so a
run's page opened on nine one-bar ``time/*`` charts above its loss. So in
MLflow, memory fields (``mem_*`` of a step or summary record) are GiB under a
``_gib`` name, and phases are ``time.<phase>``, inside "Model metrics".

Readers turn MLflow's names back (:func:`from_mlflow`), so analysis, reports and
``data.json`` see bytes and ``time/*`` whichever dstui wrote the run: older
records (bytes under ``mem_peak``, ``time/launch``) pass through unchanged.
Stdlib only: the TUI and forecasts read through it without mlflow.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

GIB = float(2**30)
MEMORY_PREFIX = "mem_"  # a record's memory fields, in bytes (dstui.core.records)
GIB_SUFFIX = "_gib"
SUMMARY_PREFIX = "summary."
PHASE_PREFIX = "time/"  # dstui.core.phases, as status.json and the report name them
PHASE_MLFLOW_PREFIX = "time."

Point = tuple[str, float, int, int]  # (key, value, timestamp ms, step)


def _split(key: str) -> tuple[str, str]:
    """(``summary.`` or '', the field name) of a metric key."""
    if key.startswith(SUMMARY_PREFIX):
        return SUMMARY_PREFIX, key[len(SUMMARY_PREFIX) :]
    return "", key


def to_mlflow(key: str, value: float) -> tuple[str, float]:
    """A record's metric as MLflow gets it: ``mem_peak`` bytes -> ``mem_peak_gib``, ``time/init`` -> ``time.init``."""
    if key.startswith(PHASE_PREFIX):
        return PHASE_MLFLOW_PREFIX + key[len(PHASE_PREFIX) :], value
    prefix, name = _split(key)
    if name.startswith(MEMORY_PREFIX) and not name.endswith(GIB_SUFFIX):
        return prefix + name + GIB_SUFFIX, value / GIB
    return key, value


def from_mlflow(key: str, value: Any) -> tuple[str, Any]:
    """The inverse of :func:`to_mlflow`; ``value`` may be a number or a numpy array (a history)."""
    if key.startswith(PHASE_MLFLOW_PREFIX):
        return PHASE_PREFIX + key[len(PHASE_MLFLOW_PREFIX) :], value
    prefix, name = _split(key)
    if name.startswith(MEMORY_PREFIX) and name.endswith(GIB_SUFFIX):
        return prefix + name[: -len(GIB_SUFFIX)], value * GIB
    return key, value


def mlflow_key(key: str) -> str:
    """The name a record's metric has in MLflow."""
    return to_mlflow(key, 0.0)[0]


def points_to_mlflow(points: Iterable[Point]) -> list[Point]:
    """Points of a run as :func:`dstui.tracking.client.log_metrics` sends them to MLflow."""
    out = []
    for key, value, ts, step in points:
        name, scaled = to_mlflow(key, value)
        out.append((name, scaled, ts, step))
    return out


def metrics_from_mlflow(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """A run's latest metrics as MLflow holds them -> as records name them (the newer name wins a clash)."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        name, scaled = from_mlflow(key, value)
        if name == key and name in out:
            continue  # an old-layout key beside its new twin: the new one is the one to read
        out[name] = scaled
    return out
