"""Which queued run may start now, and on which GPUs: runs share a box on disjoint GPUs.

A batch's ``parallel`` option: N >= 1 runs at most N at a time (1 = one
after another, the old default); ``AUTO`` (0, the default now) starts a run
whenever enough GPUs are free for it, each run on its own GPUs, so a batch
of 2-GPU conditions on an 8-GPU box runs four at a time. AUTO stays one at a
time where sharing is not safe: on a machine without GPUs (CPU ranks would
compete for the same cores and distort each other's timings), and for runs
that DeepSpeed's launcher places itself (hostfile, include/exclude filters,
more than one node).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

AUTO = 0


def gpus_needed(settings: dict[str, Any]) -> int:
    return int(settings.get("gpus", 1) or 1)


def placed_by_deepspeed(settings: dict[str, Any]) -> bool:
    """Whether DeepSpeed's launcher chooses this run's devices (then dstui must not hand out a slice)."""
    lc = settings.get("launcher") or {}
    return bool(
        int(settings.get("nodes", 1) or 1) > 1
        or lc.get("hostfile")
        or lc.get("include")
        or lc.get("exclude")
    )


def free_gpus(total: int, busy_slices: Sequence[Sequence[int] | None]) -> list[int]:
    used = {g for s in busy_slices for g in (s or [])}
    return [g for g in range(total) if g not in used]


def choose(
    settings: dict[str, Any],
    *,
    parallel: int,
    active: int,
    busy_slices: Sequence[Sequence[int] | None],
    total_gpus: int,
    elsewhere: Sequence[Sequence[int]] = (),
) -> tuple[bool, list[int] | None]:
    """(start now?, its GPU slice or None = DeepSpeed's default devices) for the next queued run.

    ``elsewhere``: the GPUs that runs of other batches hold on this machine
    (:mod:`dstui.execute.gpu_ledger`); a run never starts on one of them, and a run
    that takes the whole box (no slice) waits until no other batch holds any.
    """
    others = {g for s in elsewhere for g in s} if total_gpus else set()
    if parallel == 1 or (parallel == AUTO and (total_gpus == 0 or placed_by_deepspeed(settings))):
        return active == 0 and not others, None
    if parallel > 1 and active >= parallel:
        return False, None
    if total_gpus == 0 or placed_by_deepspeed(settings):
        return not others, None  # an explicit --parallel N on CPU: the user's choice, as before
    need = gpus_needed(settings)
    free = [g for g in free_gpus(total_gpus, busy_slices) if g not in others]
    if len(free) >= need:
        return True, free[:need]
    if active == 0 and not others:  # more GPUs than the box has: start it alone and let DeepSpeed say why
        return True, None
    return False, None
