"""Step time of a condition from first principles: what each part of an optimizer step costs.

A step is cut into terms, each in seconds under a prior guess of the hardware
(:class:`Hardware`); :mod:`dstui.analysis.time_fit` then scales every term by
a factor calibrated on measured runs. Per optimizer step and rank:

* **compute**: training FLOPs (``6N + 12·L·H·S`` per token, :mod:`dstui.core.hardware`;
  activation checkpointing recomputes the forward: 4/3 of it) over the dtype's
  peak at a prior utilisation;
* **small_batch**: a GEMM on few tokens runs below peak; modelled as the
  time of ``n_half`` tokens more per micro step (utilisation ``n/(n + n_half)``);
* **launch**: kernels and Python per layer and micro step (compiled graphs: fewer);
* **zero3**: ZeRO-3 fetches and releases every module's parameters in forward
  and backward: a latency per module and micro step;
* **comm**: bytes every rank sends in the collectives of its ZeRO stage, ring
  cost ``(n-1)/n``: ZeRO-0/1 all-reduce (or reduce-scatter + all-gather) the
  gradients once per step, ZeRO-2 reduce-scatters every micro step, ZeRO-3
  gathers the parameters twice and reduce-scatters the gradients every micro
  step; Ulysses adds its all-to-alls of q, k, v and the attention output;
* **collectives**: a latency per collective call, however small: ZeRO-0
  all-reduces once a step, at the accumulation boundary, in buckets
  (``engine.allreduce_gradients`` -> ``buffered_allreduce_fallback``), ZeRO-1
  reduces and gathers once a step, ZeRO-2 reduces every micro step, ZeRO-3
  reduce-scatters every micro step (its per-module gathers are the *zero3*
  term). (ZeRO-0 was once counted as a call per parameter tensor and micro
  step; on 2 CPU ranks of tiny-llama it is the fastest stage at every micro
  batch, 14-24 ms against ZeRO-1's 20-58 ms, 2026-11-28, DeepSpeed 0.19.8, and
  that prior kept `dstui tune` from probing it.) On CPU ranks under load every
  call waits for both processes to be scheduled, and this term dominates;
* **optimizer**: Adam's state traffic over the rank's partition on the GPU;
* **cpu_adam** / **host_link**: with offload, Adam on the host and the bytes
  over PCIe (or NVMe);
* **step**: a fixed cost per optimizer step.

Pure arithmetic; nothing here imports torch or DeepSpeed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dstui.analysis.forecast_model import DEFAULT_REDUCE_BUCKET, DTYPE_BYTES, ModelShape
from dstui.core.hardware import flops_per_token, peak_tflops
from dstui.spec.settings import Settings

TERMS = ("compute", "small_batch", "launch", "zero3", "comm", "collectives", "optimizer", "cpu_adam", "host_link", "step")
ADAM_BYTES_PER_PARAM = 32  # fp32 master, moments, gradient read; master and moments written; a 16-bit copy out
COMPILED_LAUNCH = 0.3  # share of eager launches left when a graph is compiled (DeepCompile, torch.compile)
RECOMPUTE = 4.0 / 3.0  # activation checkpointing: forward (2N) again on top of 6N


@dataclass(frozen=True)
class Hardware:
    """Prior guesses of what a rank can do; ``spread`` says how far off they may be (a factor)."""

    kind: str  # history key: "cuda:<GPU name>" or "cpu:<host>"
    device: str  # "cuda" or "cpu"
    peak_flops: dict[str, float]  # per rank and dtype, FLOP/s at the prior utilisation
    n_half: float  # tokens per micro step at which a GEMM runs at half its speed
    link_bw: float  # bytes/s per rank in collectives within a node
    net_bw: float  # ... between nodes
    mem_bw: float  # device memory
    host_bw: float  # device <-> host
    nvme_bw: float
    cpu_adam: float  # parameters per second the host optimizer updates, per rank
    launch_s: float  # per layer and micro step
    fetch_s: float  # one ZeRO-3 module fetch (hooks, latency)
    call_s: float  # one collective call's latency
    step_s: float  # fixed, per optimizer step
    spread: float

    def peak(self, dtype: str) -> float:
        return self.peak_flops.get(dtype) or min(self.peak_flops.values())


PRIOR_MFU = 0.5  # a transformer's large GEMMs on a data-center GPU; the fit corrects it
UNKNOWN_GPU_TFLOPS = {"bf16": 100.0, "fp16": 100.0, "fp32": 15.0}


def gpu_hardware(gpu_name: str | None) -> Hardware:
    """A data-center GPU over NVLink/PCIe: the data sheet's peak, typical bandwidths, a factor 3 either way."""
    table = {d: peak_tflops(gpu_name, d) for d in ("bf16", "fp16", "fp32")}
    known = {d: v * 1e12 * PRIOR_MFU for d, v in table.items() if v}
    peaks = known or {d: v * 1e12 * PRIOR_MFU for d, v in UNKNOWN_GPU_TFLOPS.items()}
    return Hardware(
        kind=f"cuda:{gpu_name or 'unknown'}", device="cuda", peak_flops=peaks, n_half=512.0,
        link_bw=100e9, net_bw=20e9, mem_bw=2e12, host_bw=20e9, nvme_bw=3e9, cpu_adam=1e9,
        launch_s=0.4e-3, fetch_s=0.15e-3, call_s=30e-6, step_s=5e-3, spread=3.0 if known else 10.0,
    )  # fmt: skip


def cpu_hardware(host: str) -> Hardware:
    """CPU ranks (gloo): a few GFLOP/s each, shared memory for collectives; a factor 30 either way."""
    return Hardware(
        kind=f"cpu:{host}", device="cpu", peak_flops={"fp32": 2e10, "bf16": 1e10, "fp16": 1e10}, n_half=64.0,
        link_bw=2e9, net_bw=1e9, mem_bw=10e9, host_bw=50e9, nvme_bw=2e9, cpu_adam=3e8,
        launch_s=2e-3, fetch_s=5e-3, call_s=2e-3, step_s=10e-3, spread=30.0,
    )  # fmt: skip


def hardware_for(device: str, gpu_name: str | None, host: str) -> Hardware:
    return gpu_hardware(gpu_name) if device == "cuda" else cpu_hardware(host)


def modules_per_layer(shape: ModelShape) -> int:
    """Modules with their own parameters in one block: what ZeRO-3 fetches one by one."""
    return 6 if shape.family == "gpt2" else 9  # gpt2: c_attn, c_proj, c_fc, c_proj, 2 LayerNorms


def _comm_bytes(s: Settings, shape: ModelShape, ranks: int) -> float:
    """Bytes one rank sends per optimizer step in ZeRO's collectives and Ulysses' all-to-alls."""
    e = DTYPE_BYTES.get(s.dtype, 4)
    p = shape.params
    ring = (ranks - 1) / ranks if ranks > 1 else 0.0
    per_stage = {0: 2 * p * e, 1: 2 * p * e, 2: (s.grad_accum + 1) * p * e, 3: 3 * s.grad_accum * p * e}
    zero = per_stage[s.zero_stage] * ring
    sp = max(1, s.sequence_parallel)
    if sp == 1:
        return zero
    local = s.micro_batch * s.seq_length / sp
    # forward and backward: q, k, v in and the attention output out, each an all-to-all of the layer's width
    a2a = 8 * shape.layers * local * shape.hidden * e * (sp - 1) / sp
    return zero + s.grad_accum * a2a


def _calls(s: Settings, shape: ModelShape, ranks: int) -> float:
    """Collective calls per optimizer step (latency-bound, whatever their size); none on one rank."""
    if ranks <= 1:
        return 0.0
    buckets = float(max(1, math.ceil(shape.params / DEFAULT_REDUCE_BUCKET)))  # DeepSpeed's bucket: elements
    ga = s.grad_accum
    per_stage = {0: buckets, 1: 2 * buckets, 2: (ga + 1) * buckets, 3: ga * buckets}
    sp = max(1, s.sequence_parallel)
    return per_stage[s.zero_stage] + (ga * 8 * shape.layers if sp > 1 else 0)


def _host_bytes(s: Settings, shape: ModelShape, partition: int) -> float:
    """Bytes over the host link per step: gradients down and parameters up (optimizer offload), fetches (params)."""
    e = DTYPE_BYTES.get(s.dtype, 4)
    part = shape.params / partition
    out = 0.0
    if s.offload != "none":
        grads = s.grad_accum if s.zero_stage == 2 else 1  # ZeRO-2 moves each micro step's gradients
        out += (4 * grads + e) * part
    if s.offload_params != "none":
        out += 2 * s.grad_accum * e * part
    return out


def terms(s: Settings, shape: ModelShape, hw: Hardware) -> dict[str, float]:
    """Each term's seconds per optimizer step on one rank under the prior hardware (see the module's text)."""
    ranks = s.gpus * s.nodes
    sp = max(1, s.sequence_parallel)
    ga = s.grad_accum
    ck = RECOMPUTE if s.activation_checkpointing else 1.0
    peak = hw.peak(s.dtype)
    fpt = flops_per_token(shape.params, shape.layers, shape.hidden, s.seq_length)
    tokens_micro = s.micro_batch * s.seq_length / sp
    compiled = COMPILED_LAUNCH if (s.deepcompile or s.compile) else 1.0
    partition = ranks if s.zero_stage >= 1 else 1
    offloaded = s.offload != "none"
    link = hw.nvme_bw if "nvme" in (s.offload, s.offload_params) else hw.host_bw
    modules = shape.layers * modules_per_layer(shape) + 3  # embeddings, final norm, head
    return {
        "compute": fpt * tokens_micro * ga * ck / peak,
        "small_batch": fpt * hw.n_half * ga * ck / peak,
        "launch": ga * shape.layers * hw.launch_s * (1.5 if s.activation_checkpointing else 1.0) * compiled,
        "zero3": (2 * ga * modules * hw.fetch_s * compiled) if s.zero_stage == 3 else 0.0,
        "comm": _comm_bytes(s, shape, ranks) / (hw.net_bw if s.nodes > 1 else hw.link_bw),
        "collectives": _calls(s, shape, ranks) * hw.call_s * (4.0 if s.nodes > 1 else 1.0),
        "optimizer": 0.0 if offloaded else shape.params / partition * ADAM_BYTES_PER_PARAM / hw.mem_bw,
        "cpu_adam": shape.params / partition / hw.cpu_adam if offloaded else 0.0,
        "host_link": _host_bytes(s, shape, partition) / link,
        "step": hw.step_s,
    }
