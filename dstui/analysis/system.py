"""GPU power and GPU memory as the driver sees it, from the supervisor's system metrics.

The supervisor samples NVML (MLflow's names: ``system/gpu_<i>_power_usage_watts``,
``system/gpu_<i>_memory_usage_megabytes``, a ``<node>/`` after ``system/`` on runs that
span nodes; stores written before have ``system/<node>/gpu<i>_power_w`` and
``.../gpu<i>_mem_used_bytes``) beside the runner's own CUDA peak.
The driver's figure includes the CUDA context, the caching allocator's
reserve and NCCL buffers, so it is what decides whether a job fits; the
report shows both.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from dstui.analysis.rundata import SYSTEM_PREFIX, RunData

_POWER = re.compile(r"/gpu_?\d+_(power_usage_watts|power_w)$")
_GPU_MEM = re.compile(r"/gpu_?\d+_(memory_usage_megabytes|mem_used_bytes)$")


def fetch_system(client: Any, runs: Sequence[RunData]) -> None:
    """Add ``gpu_power_mean_w``, ``gpu_power_max_w`` (per GPU) and ``gpu_mem_used_max`` (bytes) to run stats."""
    for r in runs:
        power: list[list[float]] = []
        mem: list[float] = []
        for key in r.metrics:
            if not key.startswith(SYSTEM_PREFIX):
                continue
            is_power, is_mem = bool(_POWER.search(key)), bool(_GPU_MEM.search(key))
            if not (is_power or is_mem):
                continue
            scale = 1e6 if key.endswith("_megabytes") else 1.0  # MLflow's megabytes are 1e6 bytes
            values = [m.value * scale for m in client.get_metric_history(r.run_id, key)]
            if not values:
                continue
            if is_power:
                power.append(values)
            else:
                mem.append(max(values))
        summarise(r, power, mem)


def summarise(run: RunData, power: list[list[float]], mem: list[float]) -> None:
    """Power: mean over GPUs of each GPU's mean, and the highest reading; memory: the highest GPU's peak."""
    if power:
        run.stats["gpu_power_mean_w"] = sum(sum(p) / len(p) for p in power) / len(power)
        run.stats["gpu_power_max_w"] = max(max(p) for p in power)
    if mem:
        run.stats["gpu_mem_used_max"] = max(mem)
