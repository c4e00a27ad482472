"""How good a memory forecast was, after the runs: forecast vs measured peak per condition (issue 14).

The report's "Memory: forecast vs measured" section reads this. The forecast
is rebuilt with :func:`dstui.analysis.forecast.forecast` from each run's
MLflow params (analytic, never a fit on the runs it is judged against); the
measured peak is ``torch.cuda.max_memory_allocated`` of finished GPU runs.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from dstui.analysis.forecast import forecast, settings_of, zero_config_of
from dstui.analysis.forecast_model import GIB
from dstui.analysis.grouping import NOT_STARTED
from dstui.core.failures import is_oom
from dstui.tracking import tags as tag_keys


def forecast_vs_measured(runs: Sequence[Any], capacity: int | None = None) -> Any:
    """Forecast vs measured peak per condition, with the error: a pandas frame, one row per condition.

    ``runs`` are :class:`dstui.analysis.rundata.RunData`; the forecast is rebuilt
    (analytic) from each run's params, so the report judges the estimate, not
    a fit on the runs it is compared with. The measured peak is the mean over
    a condition's finished GPU runs of their largest ``mem_peak``
    (``torch.cuda.max_memory_allocated``); on the CPU ``mem_peak`` is the
    process RSS, which a per-GPU forecast does not describe, so CPU runs get
    no measured value. ``error_pct`` = 100 * (forecast - measured) / measured
    (> 0: too high). ``predicted_oom``: the forecast exceeds ``capacity`` (bytes; else the GPU
    memory the runs' ``skipped: predicted OOM`` reasons name; None when unknown). ``outcome``:
    how the condition's runs ended (``done``, ``CUDA OOM``, the skip reason, ...).
    """
    import pandas as pd

    capacity = capacity or capacity_of_reasons(r.reason for r in runs)
    groups: dict[str, list[Any]] = {}
    for run in runs:
        groups.setdefault((run.label or run.condition).removesuffix(NOT_STARTED), []).append(run)
    out = []
    for cond, members in groups.items():
        settings = settings_of(members[0].params)
        fc = forecast(settings, ds_config=zero_config_of(members[0].params)) if settings else None
        if fc is None:
            continue  # a command run, or a model whose shape is unknown offline
        peaks = [_gpu_peak(r) for r in members]
        peaks = [p / GIB for p in peaks if p]
        measured = sum(peaks) / len(peaks) if peaks else None
        out.append({
            "condition": cond,
            "device": ",".join(sorted({r.tags.get(tag_keys.DEVICE) or "-" for r in members})),
            "forecast_gib": fc.gib,
            "measured_gib": measured,
            "error_pct": 100 * (fc.gib - measured) / measured if measured else None,
            "runs": len(peaks),
            "predicted_oom": fc.total > capacity if capacity else None,
            "outcome": _outcome(members),
        })  # fmt: skip
    return pd.DataFrame(out, columns=["condition", "device", "forecast_gib", "measured_gib", "error_pct", "runs",
                                      "predicted_oom", "outcome"])  # fmt: skip


def _gpu_peak(run: Any) -> float | None:
    """The largest CUDA allocation of a finished GPU run, in bytes; None otherwise."""
    if run.tags.get(tag_keys.DEVICE) != "cuda" or run.status != "done":
        return None
    return run.metrics.get("summary.mem_peak_max") or run.metrics.get("mem_peak")


def _outcome(runs: Sequence[Any]) -> str:
    """How a condition's runs ended: 'done', 'done x2', 'CUDA OOM', the skip reason, 'failed (exit code 1)'."""
    def one(run: Any) -> str:
        if is_oom(run.reason):
            return "CUDA OOM"
        if run.status == "done" or not run.reason:
            return run.status
        return run.reason if run.status == "skipped" else f"{run.status} ({run.reason})"

    counts = Counter(one(r) for r in runs)
    return ", ".join(text if n == 1 else f"{text} x{n}" for text, n in counts.items())


def capacity_of_reasons(reasons: Iterable[str]) -> int | None:
    """The GPU memory (bytes) a batch's forecasts were held against, read back from its skip reasons."""
    for reason in reasons:
        m = re.search(r"predicted OOM \([\d.]+ GiB > ([\d.]+) GiB\)", reason or "")
        if m:
            return int(float(m.group(1)) * GIB)
    return None
