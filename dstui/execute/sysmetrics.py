"""System readings of a running job: host CPU/RAM, the job's process tree, its GPUs.

The supervisor samples these into the run folder's ``system.jsonl`` so the
TUI and MLflow see the same numbers, and nothing is lost if MLflow is down.
GPU readings use nvidia-ml-py and are skipped quietly when there is no GPU.

In MLflow they carry the names of MLflow's own system-metrics logger
(``mlflow/system_metrics/metrics/*.py``: ``system/cpu_utilization_percentage``,
``system/gpu_0_memory_usage_megabytes``, ...), so MLflow's "System metrics"
views show them and the same reading of two runs shares a chart; a run that
spans nodes prefixes the node as MLflow's ``node_id`` does
(``system/<node>/cpu_utilization_percentage``). The step of a point is whole
seconds since the run's launch (:func:`mlflow_points`).
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import re
import time
from typing import Any

import psutil

from dstui.core.rundir import RunDir

_NVML: Any = None
_NVML_TRIED = False


def _nvml() -> Any:
    global _NVML, _NVML_TRIED
    if not _NVML_TRIED:
        _NVML_TRIED = True
        try:
            import pynvml

            pynvml.nvmlInit()
            _NVML = pynvml
        except Exception:  # no driver, no GPU, no library: CPU-only machine
            _NVML = None
    return _NVML


GPU_COUNT_ENV = "DSTUI_GPU_COUNT"


def gpu_count() -> int:
    """GPUs on this host (NVML); $DSTUI_GPU_COUNT overrides it (use only the first N; tests fake it)."""
    forced = os.environ.get(GPU_COUNT_ENV, "").strip()
    if forced.isdigit():
        return int(forced)
    nv = _nvml()
    if nv is None:
        return 0
    try:
        return int(nv.nvmlDeviceGetCount())
    except Exception:
        return 0


def gpu_memory_total(index: int = 0) -> int | None:
    """Total memory of one GPU in bytes (what a forecast is held against); None without one."""
    nv = _nvml()
    if nv is None or gpu_count() <= index:
        return None
    try:
        return int(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(index)).total)
    except Exception:
        return None


def gpu_name(index: int = 0) -> str | None:
    """NVML's name of one GPU ('NVIDIA H100 80GB HBM3'): which peak and history the time model uses; None without one."""
    nv = _nvml()
    if nv is None or gpu_count() <= index:
        return None
    try:
        name = nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(index))
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        return None


def gpus_support_bf16() -> bool | None:
    """Whether every GPU here computes in bf16 (compute capability >= 8.0); None when NVML cannot say."""
    nv = _nvml()
    if nv is None:
        return None
    try:
        return all(
            nv.nvmlDeviceGetCudaComputeCapability(nv.nvmlDeviceGetHandleByIndex(i))[0] >= 8
            for i in range(int(nv.nvmlDeviceGetCount()))
        )
    except Exception:
        return None


def gpu_readings(indices: list[int] | None = None) -> dict[str, float]:
    nv = _nvml()
    out: dict[str, float] = {}
    if nv is None:
        return out
    for i in indices if indices is not None else range(gpu_count()):
        try:
            h = nv.nvmlDeviceGetHandleByIndex(i)
            util = nv.nvmlDeviceGetUtilizationRates(h)
            try:  # v2 'used' excludes driver-reserved memory, like nvidia-smi
                mem = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
            except Exception:
                mem = nv.nvmlDeviceGetMemoryInfo(h)
            out[f"gpu{i}_util_percent"] = float(util.gpu)
            out[f"gpu{i}_mem_used_bytes"] = float(mem.used)
            with contextlib.suppress(Exception):
                out[f"gpu{i}_power_w"] = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
        except Exception:
            continue
    return out


class ProcessTreeSampler:
    """CPU% and RSS of a process and all its children (launcher + every rank).

    psutil's cpu_percent needs a previous call per process to measure an
    interval, so Process objects are kept between samples.
    """

    def __init__(self, pid: int, *, wrapper: bool = False) -> None:
        """``wrapper``: ``pid`` is dstui's run wrapper, whose children are the job (see :meth:`sample`)."""
        self.pid = pid
        self.wrapper = wrapper
        self._procs: dict[int, psutil.Process] = {}
        self._had_children = False
        psutil.cpu_percent(None)  # the host's interval starts here, so its first reading measures one

    def sample(self) -> dict[str, float]:
        """The tree's readings; empty once the job is gone.

        Gone: its root exited (a zombie counts as gone), or, for a run wrapper, the job
        it started has exited and only the wrapper is left, recording the exit. A
        reading then is the wrapper's own 19 MB and 1 process: shown as a run's last
        value (MLflow's headline) it read as "this condition uses almost no memory".
        (A rank's own tree, as the node sampler follows, may lose helper children
        and go on: there the rule does not apply.)
        The job's CPU is left out of a reading where no process was seen before:
        psutil's first cpu_percent of a process is 0.0, not a measurement.
        """
        try:
            root = psutil.Process(self.pid)
            if root.status() == psutil.STATUS_ZOMBIE:
                return {}
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return {}
        if len(procs) > 1:
            self._had_children = True
        elif self._had_children and self.wrapper:
            return {}
        cpu = 0.0
        measured = False
        rss = 0.0
        alive = {}
        for p in procs:
            known = self._procs.get(p.pid)
            with contextlib.suppress(psutil.Error):
                if known is None:
                    known = p
                    known.cpu_percent(None)  # starts this process's interval
                else:
                    cpu += known.cpu_percent(None)
                    measured = True
                rss += known.memory_info().rss
            alive[p.pid] = known
        self._procs = alive
        out = {"job_rss_bytes": rss, "job_processes": float(len(procs))}
        if measured:
            out["job_cpu_percent"] = cpu
        return out


def host_readings() -> dict[str, float]:
    vm = psutil.virtual_memory()
    out = {"cpu_percent": psutil.cpu_percent(None), "mem_used_bytes": float(vm.used), "mem_used_percent": float(vm.percent)}
    with contextlib.suppress(OSError):  # runnable processes on the host, ours and everyone's (contention)
        out["load_1min"] = os.getloadavg()[0]
    return out


def sample(tree: ProcessTreeSampler | None, gpus: list[int] | None) -> dict[str, Any] | None:
    """One reading of host, job and GPUs; None when the job it follows has already ended.

    A reading taken after the job's exit would end its curves on zero (a run's last
    ``job_rss_bytes`` = 0) and on an idle host: it is not a reading of the job.
    """
    rec: dict[str, Any] = {"time": time.time(), "node": platform.node()}
    rec.update(host_readings())
    if tree is not None:
        job = tree.sample()
        if not job:
            return None
        rec.update(job)
    rec.update(gpu_readings(gpus))
    return rec


# system.jsonl field -> (MLflow system-metric name, factor). The names are those of MLflow's
# own logger (mlflow/system_metrics/metrics/cpu_monitor.py, gpu_monitor.py), megabytes = 1e6
# bytes as there; job_* are dstui's (the job's process tree), spelled the same way.
MLFLOW_NAMES: dict[str, tuple[str, float]] = {
    "cpu_percent": ("cpu_utilization_percentage", 1.0),
    "mem_used_bytes": ("system_memory_usage_megabytes", 1e-6),
    "mem_used_percent": ("system_memory_usage_percentage", 1.0),
    "job_cpu_percent": ("job_cpu_utilization_percentage", 1.0),
    "job_rss_bytes": ("job_memory_usage_megabytes", 1e-6),
    "job_processes": ("job_processes", 1.0),
    "load_1min": ("load_average_1min", 1.0),
}
_GPU_NAMES: dict[str, tuple[str, float]] = {
    "util_percent": ("utilization_percentage", 1.0),
    "mem_used_bytes": ("memory_usage_megabytes", 1e-6),
    "power_w": ("power_usage_watts", 1.0),
}
_GPU_FIELD = re.compile(r"gpu(\d+)_(\w+)")
SYSTEM_PREFIX = "system/"


def mlflow_name(field: str, node: str | None = None) -> tuple[str, float] | None:
    """``gpu0_mem_used_bytes`` -> (``system/gpu_0_memory_usage_megabytes``, 1e-6); None: not a reading."""
    named = MLFLOW_NAMES.get(field)
    if named is None:
        m = _GPU_FIELD.fullmatch(field)
        gpu = _GPU_NAMES.get(m.group(2)) if m else None
        if m is None or gpu is None:
            return None
        named = (f"gpu_{m.group(1)}_{gpu[0]}", gpu[1])
    prefix = SYSTEM_PREFIX + (f"{node}/" if node else "")
    return prefix + named[0], named[1]


def mlflow_points(rec: dict[str, Any], *, started: float | None, multi_node: bool) -> list[tuple[str, float, int, int]]:
    """A system.jsonl record as MLflow points ``(key, value, timestamp ms, step)``.

    The step is whole seconds since the run's launch (``started``), so the System
    metrics charts of two runs line up by time into the run. Records are taken only
    while the job lives (:func:`sample`), so every one is sent: the supervisor's count
    of unsent points is the file's. The node prefix only where the run spans nodes.
    """
    t = rec.get("time")
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or not 0 < t < 1e11:
        return []  # a sampler's line (a node's file, merged) is not trusted to hold a sane time
    node = str(rec.get("node") or "node")[:64] if multi_node else None
    step = max(0, int(t - started)) if started else 0
    out = []
    for field, value in rec.items():
        named = mlflow_name(field, node)
        if named is None or isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        out.append((named[0], float(value) * named[1], int(t * 1000), step))
    return out


def job_life(rd: RunDir) -> dict[str, Any]:
    """What :func:`mlflow_points` needs of a run: its launch, and whether it spans nodes."""
    try:
        nodes = int(rd.settings().get("nodes") or 1)
    except (TypeError, ValueError):
        nodes = 1
    return {"started": rd.status().get("started"), "multi_node": nodes > 1}
