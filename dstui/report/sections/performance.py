"""Report sections on speed and memory: loss curves, iteration time, memory, throughput/MFU."""

from __future__ import annotations

from dstui.analysis.stats import ConditionStats
from dstui.core.formatting import fmt_gib
from dstui.report.context import ReportContext
from dstui.report.mdformat import Md, fnum, img, table


def loss(ctx: ReportContext) -> str:
    if "loss" not in ctx.images:
        return "## Loss\n\nNo loss history was recorded.\n"
    return (
        "## Loss\n\n" + img(ctx, "loss", "loss curves")
        + "\nOne line per condition: the mean over its repeats at each step; the shaded band spans "
        "the lowest and highest repeat. Warm-up steps are included (loss is deterministic from step one). "
        "The lower panel (when drawn) shows loss minus the baseline's for the conditions that should compute "
        "the same numbers as the baseline, with the parity tolerance shaded.\n"
    )


def iter_time(ctx: ReportContext) -> str:
    if "iter_time" not in ctx.images:
        return "## Iteration time\n\nNo iteration times were recorded.\n"
    rows = []
    for c in ctx.train:
        speed = _speed_cell(ctx, c)
        rows.append([
            c.label,
            ctx.t(c.iter_time_mean),
            ctx.t(c.iter_time_std),
            ctx.t(c.iter_time_repeat_std) if c.iter_time_repeat_std is not None else "-",
            c.iter_points,
            c.n_usable,
            speed,
        ])
    head = ["condition", f"mean ({ctx.unit})", f"std ({ctx.unit})", f"std of repeat means ({ctx.unit})", "iterations",
            "usable runs", "speed vs baseline" + (" (tokens/s)" if ctx.speed_basis == "tokens" else "")]
    if any(c.compile_time for c in ctx.train):
        head.append("compile time (s)")
        for row, c in zip(rows, ctx.train, strict=True):
            row.append(fnum(c.compile_time) if c.compile_time else "-")
    tbl = table(head, rows)
    return (
        "## Iteration time\n\n" + img(ctx, "iter_time", "iteration time")
        + "\nMean and sample standard deviation (n-1) over all post-warm-up iterations of a condition's usable "
        "repeats; 'std of repeat means' shows run-to-run spread. " + _speed_note(ctx) + "\n\n" + tbl + "\n"
    )


def _speed_note(ctx: ReportContext) -> str:
    what = (
        "Speed vs baseline = condition tokens/s / baseline tokens/s (> 1 is faster): tokens per step differ "
        "between conditions, so time per step does not say which is faster."
        if ctx.speed_basis == "tokens"
        else "Speed vs baseline = baseline time / condition time (> 1 is faster)."
    )
    return what + (
        " The ratio is of the mean per-run figures, with its 95% Fieller interval over repeats; with one "
        "usable run on a side there is no interval (n=1), so the ratio is a single observation, not a finding."
    )


def _speed_cell(ctx: ReportContext, c: ConditionStats) -> str:
    """The speed ratio with its interval, or the ratio as one observation with 'n=1, no interval'."""
    sr = ctx.speed_ratios.get(c.label)
    if sr is None or sr.ratio is None:
        return ""
    return Md(sr.text() if sr.claimable else f"{sr.ratio:.3f}x ({sr.text()})")  # dstui's words around numbers


def memory(ctx: ReportContext) -> str:
    if "memory" not in ctx.images:
        return "## Memory\n\nNo memory readings were recorded.\n"
    base = ctx.base()
    rows = []
    for c in ctx.train:
        ratio = ""
        if base and base.mem_peak_max and c.mem_peak_max:
            ratio = f"{c.mem_peak_max / base.mem_peak_max:.3f}x"
        rows.append([c.label, fnum(c.mem_peak_gb, digits=3), ratio, fmt_gib(c.mem_alloc_max)])
    if ctx.on_cpu:  # the runner reads the process's RSS on CPU: say so, never "tensor memory"
        what = (
            "These runs ran on CPU, where dstui measures the resident memory (RSS) of rank 0's process, not the "
            "memory of tensors: that includes Python, the libraries, DeepSpeed's buffers and the allocator's cache. "
            "Peak RSS: the largest RSS the process reached over the whole run (warm-up included), mean over "
            "repeats. RSS at a step: the largest RSS read when a step was logged, mean over repeats.\n\n"
        )
        head = ["condition", "peak RSS (GiB)", "vs baseline", "RSS at a step (GiB)"]
    else:
        what = (
            "Peak memory of rank 0 over the whole run (warm-up included: a peak is a peak), mean over repeats. "
            "On GPU this is `torch.cuda.max_memory_allocated`, on CPU the process's peak RSS.\n\n"
            "Allocated: the largest `alloc_mem` a run logged (on GPU `torch.cuda.memory_allocated`, the memory "
            "held by live tensors; on CPU the process's RSS at that step), mean over repeats.\n\n"
        )
        head = ["condition", "peak (GiB)", "vs baseline", "allocated (GiB)"]
    return "## Memory\n\n" + img(ctx, "memory", "peak memory") + "\n" + what + table(head, rows) + "\n"


def throughput(ctx: ReportContext) -> str:
    if "throughput" not in ctx.images and "mfu" not in ctx.images:
        return ""
    lines = ["## Throughput and MFU", ""]
    lines.append(
        "Throughput, TFLOP/s and MFU are total work / total time over the post-warm-up steps of the usable "
        "runs (the harmonic mean of the per-step rates), so they agree with the mean iteration time.\n"
    )
    if "throughput" in ctx.images:
        lines.append(img(ctx, "throughput", "throughput"))
        if any(c.tokens_per_s_derived for c in ctx.train):
            lines.append(
                "Where a run did not log `tokens_per_s`, throughput is tokens per step / mean iteration time.\n"
            )
    if "mfu" in ctx.images:
        lines.append(img(ctx, "mfu", "MFU"))
    rows = [
        [c.label, fnum(c.tokens_per_s_mean), fnum(c.tflops_per_gpu_mean), fnum(c.mfu_mean * 100 if c.mfu_mean is not None else None, digits=2)]
        for c in ctx.train
    ]
    lines.append(table(["condition", "tokens/s", "TFLOP/s per GPU", "MFU (%)"], rows))
    return "\n".join(lines) + "\n"


def _cond_mean(c: ConditionStats, key: str) -> float | None:
    vals = [r.stats[key] for r in c.runs if r.usable and r.stats.get(key) is not None]
    return sum(vals) / len(vals) if vals else None


def system(ctx: ReportContext) -> str:
    """GPU power and driver-seen GPU memory (NVML samples), beside the runner's CUDA peak."""
    keys = ("gpu_power_mean_w", "gpu_power_max_w", "gpu_mem_used_max")
    if not any(r.stats.get(k) is not None for r in ctx.runs for k in keys):
        return ""
    rows = []
    for c in ctx.train:
        pm_, px, mem = (_cond_mean(c, k) for k in keys)
        rows.append([c.label, fnum(pm_, 1), fnum(px, 1), fmt_gib(mem), fmt_gib(c.mem_peak_max)])
    return (
        "## GPU power and memory (driver view)\n\n"
        "Sampled by the supervisor through NVML while each run ran, mean over usable repeats. Power in watts per GPU "
        "(mean of each GPU's mean; max: highest single reading). 'Driver-seen' memory is NVML's used memory of the "
        "fullest GPU: CUDA context, allocator reserve and communication buffers included, so it exceeds the "
        "runner's `max_memory_allocated` peak.\n\n"
        + table(["condition", "power mean (W/GPU)", "power max (W)", "GPU memory, driver-seen (GiB)", "CUDA peak allocated (GiB)"], rows)
        + "\n"
    )
