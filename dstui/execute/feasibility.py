"""Can each run work on this machine? One check before anything is built or launched.

A DeepCompile run on a CPU box used to launch, build its environment, start its
ranks and fail ten seconds later with "DeepCompile needs a CUDA device"; a
``gpus: 6`` condition on a box with none was printed by ``--dry-run`` without a
word. Compose, ``dstui run`` and ``dstui run --dry-run`` now ask this module
the same question and refuse such runs with one line each (run, setting,
reason); ``--force`` launches them anyway.

The machine is what the supervisor will see: NVML's GPUs (``DSTUI_GPU_COUNT``
overrides the count, as it does for the supervisor's GPU sharing), their
memory and compute capability, and the CPU cores that carry CPU ranks: what the
local backend's :meth:`capacity` says a run gets. A backend whose runs go
elsewhere has no such machine (``capacity() is None``) and its runs are not
judged here: Slurm's preflight asks ``sbatch --test-only`` instead
(:func:`dstui.execute.backends.slurm.preflight`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dstui.core.errors import DstuiError
from dstui.execute import backends, gpu_share, sysmetrics

GIB = 1024**3
# CPU ranks per core a run may ask for: a functional CPU run of 3 ranks on 2 cores works (slowly,
# its timings meaningless); 6 on 2 cores is a GPU setting on the wrong machine
CPU_RANKS_PER_CORE = 2


@dataclass(frozen=True)
class Machine:
    """What a local run can use: GPUs (0 on a CPU box), their memory and bf16 support, CPU cores."""

    gpus: int
    gpu_memory: int | None = None  # bytes of the smallest GPU; None: unknown
    bf16: bool | None = None  # every GPU has compute capability >= 8.0; None: unknown
    cpu_cores: int = 1

    def describe(self) -> str:
        cores = f"{self.cpu_cores} CPU core{'s' if self.cpu_cores != 1 else ''}"
        if not self.gpus:
            return f"no GPU, {cores}"
        mem = f" of {self.gpu_memory / GIB:.0f} GiB" if self.gpu_memory else ""
        return f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}{mem}, {cores}"


def this_machine() -> Machine:
    gpus = sysmetrics.gpu_count()
    return Machine(
        gpus=gpus,
        gpu_memory=sysmetrics.gpu_memory_total() if gpus else None,
        bf16=sysmetrics.gpus_support_bf16() if gpus else None,
        cpu_cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1),
    )


@dataclass(frozen=True)
class Infeasible:
    """Why one run cannot work here: the setting that asks for it and the reason."""

    run: str
    field: str
    value: Any
    reason: str

    def line(self, file: str | None = None) -> str:
        where = f"{file}: " if file else ""
        value = str(self.value).lower() if isinstance(self.value, bool) else self.value
        return f"{where}run {self.run}: {self.field}={value}: {self.reason}"


def run_problem(
    settings: Mapping[str, Any],
    machine: Machine,
    *,
    forecast_bytes: int | None = None,
    capacity: int | None = None,
) -> tuple[str, Any, str] | None:
    """(field, value, reason) of the first thing this run needs and the machine lacks, else None."""
    kind = settings.get("kind", "train")
    ranks = gpu_share.gpus_needed(dict(settings))
    placed_elsewhere = gpu_share.placed_by_deepspeed(dict(settings))  # a hostfile's nodes, not this box
    if not placed_elsewhere:
        if machine.gpus and ranks > machine.gpus:
            return "gpus", ranks, f"needs {ranks} GPUs per node; this machine has {machine.gpus}"
        if not machine.gpus and ranks > CPU_RANKS_PER_CORE * machine.cpu_cores:
            most = CPU_RANKS_PER_CORE * machine.cpu_cores
            return "gpus", ranks, (
                f"this machine has no GPU: {ranks} ranks would run as CPU processes on "
                f"{machine.cpu_cores} core{'s' if machine.cpu_cores != 1 else ''} (at most {most})"
            )
    if kind == "command":
        return None  # a user's own program: only its rank count is dstui's business
    if not machine.gpus:
        if settings.get("deepcompile"):
            return "deepcompile", True, "DeepCompile needs a CUDA GPU; this machine has none (compile: true works on the CPU)"
        if settings.get("sp_mode") == "deepcompile" and int(settings.get("sequence_parallel") or 1) > 1:
            return "sp_mode", "deepcompile", "DeepCompile needs a CUDA GPU; this machine has none (sp_mode: compile works on the CPU)"
        if settings.get("dtype") == "fp16":
            return "dtype", "fp16", "DeepSpeed refuses fp16 on the CPU; use bf16 or fp32"
    elif settings.get("dtype") == "bf16" and machine.bf16 is False:
        return "dtype", "bf16", "these GPUs have no bf16 support (compute capability < 8.0); use fp16 or fp32"
    if forecast_bytes and capacity and forecast_bytes > capacity:
        return "memory", f"{forecast_bytes / GIB:.1f}GiB", (
            f"forecast {forecast_bytes / GIB:.1f} GiB per GPU > {capacity / GIB:.1f} GiB "
            "(--skip-predicted-oom launches the others and skips it)"
        )
    return None


def problems(
    runs: Iterable[Any],
    machine: Machine | None,
    *,
    forecasts: Mapping[str, Any] | None = None,
    capacity: int | None = None,
) -> list[Infeasible]:
    """Every run (a RunSpec) that cannot work on ``machine``, in batch order; none without a machine
    (a backend whose runs a scheduler places: :meth:`~dstui.execute.backends.base.Backend.capacity`)."""
    if machine is None:
        return []
    out = []
    for r in runs:
        fc = (forecasts or {}).get(r.name)
        found = run_problem(
            r.settings.model_dump(mode="json"), machine,
            forecast_bytes=getattr(fc, "total", None), capacity=capacity,
        )  # fmt: skip
        if found:
            out.append(Infeasible(r.name, *found))
    return out


class InfeasibleRuns(DstuiError):
    """Runs that cannot work here; nothing was launched."""

    def __init__(self, found: list[Infeasible], machine: Machine, file: str | None) -> None:
        self.found = found
        head = (
            f"{len(found)} run{'s' if len(found) != 1 else ''} cannot work on this machine "
            f"({machine.describe()}); nothing launched (--force launches anyway):"
        )
        super().__init__("\n".join([head, *(f"  {p.line(file)}" for p in found)]))


def refuse_infeasible(
    plan: Any,
    *,
    force: bool = False,
    machine: Machine | None = None,
    forecasts: Mapping[str, Any] | None = None,
    capacity: int | None = None,
    skip_predicted_oom: bool = False,
) -> list[Infeasible]:
    """Raise :class:`InfeasibleRuns` for a plan (dstui.execute.batch.Plan) with runs that cannot work.

    With ``force`` the problems are returned for the caller to print and nothing is
    raised. Runs that ``skip_predicted_oom`` will skip are not refused for memory.
    ``machine``: what the runs are held against (default: what the plan's backend gives a run).
    """
    machine = machine or backends.get(plan.spec.executor).capacity()
    if machine is None:
        return []
    found = problems(plan.runs, machine, forecasts=forecasts, capacity=capacity)
    if skip_predicted_oom:
        found = [p for p in found if p.field != "memory"]
    if found and not force:
        raise InfeasibleRuns(found, machine, str(plan.spec_path))
    return found
