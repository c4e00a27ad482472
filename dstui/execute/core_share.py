"""Whether a queued run may start now as far as this machine's CPU cores go: cores are one resource.

GPUs were already shared across batches (:mod:`~dstui.execute.gpu_ledger`), CPU
cores were not: `dstui run smoke.yaml &` then `dstui run lrsweep.yaml` ran both
batches at once on 2 cores with no word, and the smoke report then read 221 ± 188
ms/step for z0 against 26 for z1. Now each local run claims cores in the
machine's ledger when it starts:

- without GPUs, every core: its ranks compute on the CPU, and torch's intra-op
  threads fill whatever cores there are (a ``kind: command`` run is counted the
  same: dstui cannot tell what it computes);
- with GPUs, one core per local rank (the ranks feed their GPUs).

A run whose claim does not fit beside the claims of other batches' live runs
waits (``waiting for cores used by batch X (runs ...)``), as a run waits for GPUs.
A batch launched with ``overlap`` (``dstui run --overlap``) starts its runs anyway;
what ran beside each run is then recorded (:mod:`~dstui.execute.overlap`) and
reports leave those timings out of speed comparisons.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from dstui.core.rundir import BatchDir
from dstui.execute.gpu_ledger import Holder
from dstui.execute.gpu_share import gpus_needed

WAIT = "wait"  # batch.json "cores": the default, a run waits for cores other batches use
OVERLAP = "overlap"  # starts beside them; the overlap is recorded and reports leave the timings out
CHOICES = (WAIT, OVERLAP)


def allow_overlap(b: BatchDir) -> None:
    """Launched to overlap (``dstui run --overlap``): its runs start beside other batches' runs; before its supervisor starts."""
    b.update_info(cores=OVERLAP)


def machine_cores() -> int:
    """The cores this process may run on (a cgroup or taskset may give fewer than the machine has)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def cores_needed(settings: dict[str, Any], *, total_gpus: int, cores: int) -> int:
    """The cores a run claims: all of them without GPUs, one per local rank with GPUs."""
    if total_gpus == 0:
        return cores
    return max(1, min(cores, gpus_needed(settings)))


def blocking(others: Sequence[Holder], need: int, cores: int) -> list[Holder]:
    """The other batches' live runs that keep a claim of ``need`` cores from fitting (empty: it fits)."""
    claims = [h for h in others if h.cores > 0]
    if not claims or sum(h.cores for h in claims) + need <= cores:
        return []
    return claims
