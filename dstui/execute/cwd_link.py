"""A run folder reached through a path that stays the same, so a run finds the GPU kernels compiled by the run before.

cuDNN builds its fused attention kernels with NVRTC on a process's first
attention call, and the CUDA JIT cache (``~/.nv/ComputeCache``) keeps the
result for later processes. The cache key includes the process's working
directory as glibc's ``get_current_dir_name()`` names it: ``$PWD`` when that
names the working directory, else the physical path. Measured on the lent
H100 (``benchmarks/gpu/diag_cwd.sh``, docs/BENCHMARKS.md): a process in a
folder the cache has seen pays 0.2 s for its first attention call, one in a
new folder 1.2-2.0 s (llama-1b shapes). dstui starts each bundled-runner run
in its own new folder, so every run paid the compile again, where a bare
script started from one folder pays it once.

The run still starts in its own folder: its relative outputs (DeepSpeed's
monitors, a profiler's file) land there as before, and a DeepSpeed clone in
the user's folder cannot shadow the revision's. Only ``PWD`` changes: it names
``<cache>/cwd/<slot>``, a link re-pointed at the run's folder before the
start. The slot is the run's GPU slice: runs on the same GPUs never overlap
(:mod:`dstui.execute.gpu_ledger`), so a link changes only after the run using
it has ended (:func:`slot_name` says when runs share one). Should it change early anyway, ``PWD`` no longer names the
process's folder and glibc falls back to the physical path: a cache miss,
never a wrong folder.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

from dstui.core import paths


def links_dir() -> Path:
    return paths.cache_dir() / "cwd"


def slot_name(gpu_slice: Sequence[int] | None) -> str:
    """``gpus-0-1`` for a slice; ``all`` for a run without one.

    On a GPU box a run without a slice has the box to itself (DeepSpeed places
    it). CPU runs started side by side (``--parallel N``) share ``all``; a link
    re-pointed under one of them costs it a cache miss, of kernels a CPU run
    does not compile.
    """
    return "gpus-" + "-".join(str(g) for g in gpu_slice) if gpu_slice else "all"


def point(run_dir: Path, gpu_slice: Sequence[int] | None) -> str | None:
    """Re-point the slot's link at ``run_dir``; the link's path for ``PWD``, or None where no link can be made.

    The link is replaced in one rename, so a reader sees the old target or the
    new one, never none. Any failure (a read-only cache, a file system without
    links) leaves the run as it was: started in its folder under its own path.
    """
    link = links_dir() / slot_name(gpu_slice)
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    try:
        link.parent.mkdir(parents=True, exist_ok=True)
        tmp.unlink(missing_ok=True)
        os.symlink(os.path.abspath(run_dir), tmp)
        os.replace(tmp, link)
        return str(link) if os.path.samefile(link, run_dir) else None
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        return None


def env_for(run_dir: Path, gpu_slice: Sequence[int] | None) -> dict[str, str]:
    """``{"PWD": link}`` for a process started in ``run_dir``; empty where no link could be made."""
    link = point(run_dir, gpu_slice)
    return {"PWD": link} if link else {}
