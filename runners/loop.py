"""The measured loop of runners/train.py: steps, the records it writes, and the sp-check twin run."""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable
from typing import Any

import common
import process_group
from phases import PhaseClock
from probe_control import StopRequest, hang_if_injected, injected_hang_step
from sp_probe import Probe
from trainer import Trainer

from dstui.core.records import HEADER, STEP, SUMMARY, MetricsWriter, seed_line


def _grad_norm(engine: Any) -> float | None:
    """The global gradient norm of the last optimizer step, where DeepSpeed computed one (else None)."""
    get = getattr(engine, "get_global_grad_norm", None)
    try:
        norm = get() if get is not None else None
        return float(norm) if norm is not None and math.isfinite(float(norm)) else None
    except (TypeError, ValueError, RuntimeError):
        return None


def timing_summary(
    times: list[float], warmup: int, tokens_per_step: float, tflops_of: Callable[[float], float], peak: float | None
) -> dict[str, float]:
    """The summary record's timing figures over the steps after warm-up (every step if all are warm-up).

    Rates are total work / total time (tokens per step / mean step time), as
    the report computes them (dstui.analysis.stats.rate_mean): the mean of
    per-step rates would overstate throughput whenever step times vary, and
    the record, MLflow's ``summary.*`` metrics and the report would disagree.
    """
    timed = times[warmup:] or times
    later = times[1:]
    mean_time = statistics.fmean(timed)
    out = {
        "iter_time_mean": mean_time,
        "iter_time_std": statistics.stdev(timed) if len(timed) > 1 else 0.0,
        "tokens_per_s_mean": tokens_per_step / mean_time,
        "tflops_per_gpu_mean": tflops_of(mean_time),
        # The first step pays for compilation, autotuning and allocator warm-up.
        "compile_time": max(0.0, times[0] - statistics.median(later)) if later else 0.0,
    }
    if peak:
        out["mfu_mean"] = out["tflops_per_gpu_mean"] / peak
    return out


def _write_header(writer: MetricsWriter, tr: Trainer, args: argparse.Namespace) -> None:
    writer.write(
        HEADER,
        config=vars(args),
        ds_config=tr.ds_config,
        versions=common.versions(),
        deepspeed_git_sha=common.deepspeed_git_sha(),
        device=tr.dev["device"],
        gpu_name=tr.dev["gpu_name"],
        gpu_count=tr.dev["gpu_count"],
        world_size=tr.world,
        hostname=common.hostname(),
        tokens_per_step=tr.tokens_per_step,
        params=tr.params,
        model_init=tr.model_init,
        flops_per_token=tr.flops_per_token,
        peak_tflops=tr.peak,
        data=tr.data_source,
        sequence_parallel=tr.sp,
        dp_world_size=tr.dp,
        model_shape={"layers": tr.layers, "hidden": tr.hidden, "heads": tr.heads, "kv_heads": tr.kv_heads, "vocab": tr.vocab},
        **({"cpu_shm_op": "skipped (no step uses it)"} if process_group.SHM_OP_SKIPPED else {}),
    )


def _log_step(tr: Trainer, writer: MetricsWriter, step: int, loss: float, dt: float, rank0: bool) -> int:
    """One step record, and the seed's human line on rank 0; returns the memory peak it recorded."""
    alloc, peak = tr.memory()
    rec: dict[str, Any] = {
        "step": step,
        "epoch": tr.epoch(),
        "loss": loss,
        "iter_time": dt,
        "tokens_per_s": tr.tokens_per_step / dt,
    }
    rec["tflops_per_gpu"] = tr.tflops_per_gpu(dt)
    if tr.peak:
        rec["mfu"] = rec["tflops_per_gpu"] / tr.peak
    rec.update(mem_alloc=alloc, mem_peak=peak, lr=tr.lr())
    grad_norm = _grad_norm(tr.engine)
    if grad_norm is not None:
        rec["grad_norm"] = grad_norm
    writer.write(STEP, **rec)
    if rank0:
        print(seed_line(rec["epoch"], step, loss, dt, alloc, peak), flush=True)
    return peak


def train(
    args: argparse.Namespace,
    ds_config: dict[str, Any],
    *,
    use_sp: bool,
    writer: MetricsWriter | None,
    clock: PhaseClock | None = None,
    probe: Probe | None = None,
) -> list[float]:
    """Run ``args.steps`` optimizer steps; return the logged losses. ``writer`` None = a silent check run.

    A ``probe`` (the sp-check's) captures step 1's tensors in an eager forward before the first step
    (runners/sp_probe.capture), outside what is compiled and timed.
    """
    tr = Trainer(args, ds_config, use_sp=use_sp, clock=clock, probe=probe)
    rank0 = tr.rank == 0
    if writer is not None:
        _write_header(writer, tr, args)

    times: list[float] = []
    losses: list[float] = []
    mem_peak_max = 0
    stop = StopRequest(args.metrics_file if (rank0 and writer is not None) else None)
    hang_step = injected_hang_step(vars(args)) if writer is not None else None
    stopped_at = None
    for step in range(1, args.steps + 1):
        dt, total = tr.step()
        times.append(dt)
        if clock is not None and step == 1:
            clock.mark("first_step_done")
        if step % args.log_interval and step != args.steps:
            continue
        loss, stopping = tr.global_loss(total, stop.asked())  # the only extra sync: on logged steps
        if clock is not None and (step == args.steps or stopping):
            clock.mark("last_step_done")
        losses.append(loss)
        if writer is None:
            continue
        mem_peak_max = max(mem_peak_max, _log_step(tr, writer, step, loss, dt, rank0))
        hang_if_injected(hang_step, step)
        if stopping:  # asked to stop (dstui tune's probe is measured): end as a finished run
            stopped_at = step
            break

    if writer is not None:
        # Statistics over every step after warm-up, logged or not: the timing
        # sync happens on every step, so unlogged steps are measured too.
        summary: dict[str, Any] = {
            "steps": len(times),
            "warmup_steps": args.warmup_steps,
            **timing_summary(times, args.warmup_steps, tr.tokens_per_step, tr.tflops_per_gpu, tr.peak),
            "step_time_sum": sum(times),  # for the run's step share (dstui.core.phases)
            "mem_peak_max": max(mem_peak_max, tr.memory()[1]),
            "final_loss": losses[-1] if losses else None,
            "status": "ok",
        }
        if stopped_at is not None:
            summary["stopped_at"] = stopped_at  # a stop request ended it before args.steps
        summary.update(common.compile_cache_counts())
        summary.update(common.compile_graph_counts())  # the SP run's own: the sp-check's runs come later
        writer.write(SUMMARY, **summary)
    destroy = getattr(tr.engine, "destroy", None)
    if destroy is not None:  # frees ZeRO hooks/buffers before a second engine (--sp-check)
        destroy()
    return losses
