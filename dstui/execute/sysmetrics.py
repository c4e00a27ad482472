"""System readings of a running job: host CPU/RAM, the job's process tree, its GPUs.

The supervisor samples these into the run folder's ``system.jsonl`` so the
TUI and MLflow see the same numbers, and nothing is lost if MLflow is down.
GPU readings use nvidia-ml-py and are skipped quietly when there is no GPU.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from typing import Any

import psutil

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

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._procs: dict[int, psutil.Process] = {}

    def sample(self) -> dict[str, float]:
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return {}
        cpu = 0.0
        rss = 0.0
        alive = {}
        for p in procs:
            known = self._procs.get(p.pid, p)
            alive[p.pid] = known
            with contextlib.suppress(psutil.Error):
                cpu += known.cpu_percent(None)
                rss += known.memory_info().rss
        self._procs = alive
        return {"job_cpu_percent": cpu, "job_rss_bytes": rss, "job_processes": float(len(procs))}


def host_readings() -> dict[str, float]:
    vm = psutil.virtual_memory()
    return {"cpu_percent": psutil.cpu_percent(None), "mem_used_bytes": float(vm.used)}


def sample(tree: ProcessTreeSampler | None, gpus: list[int] | None) -> dict[str, Any]:
    rec: dict[str, Any] = {"time": time.time(), "node": platform.node()}
    rec.update(host_readings())
    if tree is not None:
        rec.update(tree.sample())
    rec.update(gpu_readings(gpus))
    return rec
