"""Ring attention over the sequence-parallel group (``sp_mode: ring``), on PyTorch's context-parallel ring.

The ring is PyTorch's own: ``_templated_ring_attention`` and its backward from
``torch.distributed.tensor.experimental._context_parallel``, the code that
``context_parallel()`` dispatches SDPA to. The public context manager cannot be used
as-is here: it swaps SDPA through DTensor, which has no sharding rule for the CPU flash
kernel (torch 2.13: "aten._scaled_dot_product_flash_attention_for_cpu.default does not
have a sharding strategy registered"), and it reshards whole model inputs itself. So the
ring is called from the model's attention slot (runners/sp_attention.py), with the SDPA
kernel of the device that returns the log-sum-exp the ring merges with: the CPU flash
kernel on CPU, the memory-efficient kernel on CUDA (any dtype; the path torch's CP takes
for fp32). Causal load balancing as torch's CP does it: rank r of n holds sequence
chunks r and 2n-1-r of 2n, so every rank does the same work.

Groups, data order and loss are Ulysses' (runners/ulysses.py): DeepSpeed's SP ``mpu``,
the SP peers' samples in turn, the full-sequence mean loss.

Faults for the check (``--sp-inject``): ``head-split`` rotates the value heads of every
K/V block received over the ring; ``shard-offset`` hands each rank the next rank's chunks.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import itertools
from collections.abc import Iterator
from typing import Any

import sp_attention
import ulysses
from common import RunnerError
from corpus import ShardedBatches
from sp_probe import Place, Probe

# stage -> (words for the verdict, its tensors)
STAGES = {
    "shard": ("sequence shard, before the ring", "qkv"),
    "exchanged": ("received over the ring", "kv"),
    "attention": ("attention output", "o"),
}


def _torch_ring() -> tuple[Any, Any, Any]:
    """torch's ring forward, backward and options, where this torch keeps them (moved in 2.9's CP refactor)."""
    import torch

    for name in ("torch.distributed.tensor.experimental._context_parallel._attention",
                 "torch.distributed.tensor.experimental._attention"):  # fmt: skip
        try:
            cp = importlib.import_module(name)
            return cp._templated_ring_attention, cp._templated_ring_attention_backward, cp._cp_options
        except (ImportError, AttributeError):
            continue
    raise RunnerError(f"sp_mode ring needs PyTorch's context-parallel ring; torch {torch.__version__} has none")


def _ring_group(fn: Any, group: Any, device_type: str) -> Any:
    """What torch's ring takes first: the process group (torch >= 2.9) or, before, a 1-D mesh over it."""
    if next(iter(inspect.signature(fn).parameters)) == "group":
        return group
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(group, device_type)


def _kernels(device_type: str) -> tuple[Any, dict[str, Any], Any, dict[str, Any], tuple[str, ...]]:
    """The SDPA kernel the ring calls per block: forward op and keywords, backward op and keywords, and the
    names under which the backward takes the forward's extra outputs."""
    import torch

    aten = torch.ops.aten
    if device_type == "cpu":
        return (aten._scaled_dot_product_flash_attention_for_cpu.default, {"dropout_p": 0.0},
                aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
                {"dropout_p": 0.0, "grad_out_name": "grad_out"}, ())  # fmt: skip
    return (aten._scaled_dot_product_efficient_attention.default,
            {"attn_bias": None, "compute_log_sumexp": True, "dropout_p": 0.0},
            aten._scaled_dot_product_efficient_attention_backward.default,
            {"attn_bias": None, "dropout_p": 0.0, "grad_input_mask": (True, True, True, False),
             "grad_out_name": "grad_out_"}, ("philox_seed", "philox_offset"))  # fmt: skip


def chunk_tokens(seq_length: int, sp: int, slot: int) -> tuple[tuple[int, int], ...]:
    """The token spans of load-balanced slot ``slot``: chunks slot and 2n-1-slot of 2n."""
    c = seq_length // (2 * sp)
    return ((slot * c, (slot + 1) * c), ((2 * sp - 1 - slot) * c, (2 * sp - slot) * c))


def check_shape(args: argparse.Namespace, heads: int) -> None:
    sp = args.sequence_parallel
    if args.seq_length % (2 * sp):
        raise RunnerError(
            f"sp_mode ring splits the sequence into 2 x {sp} chunks: --seq-length {args.seq_length} "
            f"must be a multiple of {2 * sp}"
        )
    if getattr(args, "sp_inject", "none") == "head-split" and heads < 2:
        raise RunnerError("--sp-inject head-split rotates value heads: the model has one head")


def register(args: argparse.Namespace, config: Any, heads: int, kv_heads: int, probe: Probe | None) -> Any:
    """Install ring attention in the model's attention slot; return DeepSpeed's SP mpu (the groups)."""
    import deepspeed.runtime.sequence_parallel.parallel_state_sp as mpu
    from deepspeed.accelerator import get_accelerator

    check_shape(args, heads)
    forward, backward, options = _torch_ring()
    options.enable_load_balance = True  # the chunk layout of data() below
    config._attn_implementation = sp_attention.ATTN
    sp_attention.plain()
    mpu.initialize_sequence_parallel(sequence_parallel_size=args.sequence_parallel)
    group, rank, sp = mpu.get_sequence_parallel_group(), mpu.get_sequence_parallel_rank(), args.sequence_parallel
    device_type = get_accelerator().device_name()
    ring_fn = _ring_function(forward, backward, _ring_group(forward, group, device_type), _kernels(device_type))
    inject = getattr(args, "sp_inject", "none")
    if probe is not None:
        probe.stages.update(STAGES)
    mine = chunk_tokens(args.seq_length, sp, rank)

    def attend(module: Any, query: Any, key: Any, value: Any, attention_mask: Any = None, dropout: float = 0.0,
               scaling: float | None = None, **kwargs: Any) -> Any:
        # The mask HF builds for this shard's positions means nothing across the ring: causal it is.
        watching = probe if probe is not None and probe.active else None  # after step 1: not even a call
        if watching is not None:
            for name, t in (("q", query), ("k", key), ("v", value)):
                watching.take(module, "shard", name, t, Place(name, mine))
        rep = query.shape[1] // key.shape[1]
        if rep > 1:  # GQA: the kernels want as many K/V heads as Q heads
            key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
        received = _received(module, watching, inject, args.seq_length, sp, rank, rep, key.shape[1])
        out = ring_fn(query, key, value, scaling, received)
        out = out.transpose(1, 2).contiguous()  # [batch, tokens, heads, dim], as HF's SDPA returns it
        if watching is not None:
            watching.take(module, "attention", "o", out, Place("o", mine))
        return out, None

    sp_attention.put(attend)
    return mpu


def _received(
    module: Any, probe: Probe | None, inject: str, seq: int, sp: int, rank: int, rep: int, kv_heads: int
) -> Any:
    """What happens to the K/V block of ring step i > 0 before the kernel sees it: a fault, a capture."""
    heads = tuple(h // rep for h in range(kv_heads)) if rep > 1 else None

    def on_block(i: int, key: Any, value: Any) -> tuple[Any, Any]:
        if inject == "head-split":
            value = value.roll(1, dims=1)
        if probe is not None:
            # torch's ring: the block of step i is source (rank - i)'s; for i <= rank only its first chunk is used
            src = (rank - i) % sp
            tokens = chunk_tokens(seq, sp, src)[:1] if i <= rank else chunk_tokens(seq, sp, src)
            probe.take(module, "exchanged", "k", key, Place("k", tokens, heads), part=i)
            probe.take(module, "exchanged", "v", value, Place("v", tokens, heads), part=i)
        return key, value

    return on_block


def _ring_function(forward: Any, backward: Any, group: Any, kernels: tuple[Any, ...]) -> Any:
    """An autograd function around torch's ring forward/backward with the device's SDPA kernel."""
    import torch

    fwd_op, fwd_kw, bwd_op, bwd_kw, rest_names = kernels

    class RingAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, query: Any, key: Any, value: Any, scale: Any, on_block: Any) -> Any:
            step = itertools.count()

            def op(q: Any, k: Any, v: Any, **kw: Any) -> Any:
                i = next(step)
                if i > 0:
                    k, v = on_block(i, k, v)
                return fwd_op(q, k, v, **kw)

            out, lse, *rest = forward(group, 2, op, query, key, value, is_causal=True, scale=scale, **fwd_kw)
            ctx.save_for_backward(query, key, value, out, lse)
            ctx.scale, ctx.rest = scale, dict(zip(rest_names, rest, strict=False))
            return out

        @staticmethod
        def backward(ctx: Any, grad_out: Any) -> Any:
            query, key, value, out, lse = ctx.saved_tensors
            dq, dk, dv, *_ = backward(
                group, 2, bwd_op, grad_out=grad_out, query=query, key=key, value=value, out=out,
                logsumexp=lse, is_causal=True, scale=ctx.scale, **bwd_kw, **ctx.rest,
            )  # fmt: skip
            return dq, dk, dv, None, None

    def call(query: Any, key: Any, value: Any, scale: Any, on_block: Any) -> Any:
        return RingAttention.apply(query, key, value, scale, on_block)

    return call


def data(shard: ShardedBatches, accel: Any, args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """This rank's load-balanced chunks of each SP peer's sample in turn (Ulysses' order, no exchange needed)."""
    import deepspeed.comm as dist
    import deepspeed.runtime.sequence_parallel.parallel_state_sp as mpu
    import torch

    sp, slot = mpu.get_sequence_parallel_world_size(), mpu.get_sequence_parallel_rank()
    if getattr(args, "sp_inject", "none") == "shard-offset":
        slot = (slot + 1) % sp
    idx = torch.tensor([t for a, b in chunk_tokens(args.seq_length, sp, slot) for t in range(a, b)])
    for batch in ulysses.reference_batches(shard, sp, dist.get_rank(), dist.get_world_size()):
        # the label of token t is token t+1 of the whole sequence: shifted before it is cut
        shifted = torch.nn.functional.pad(batch["labels"], (0, 1), value=-100)[..., 1:]
        yield {
            "input_ids": batch["input_ids"][:, idx],
            "position_ids": batch["position_ids"][:, idx],
            "shift_labels": shifted[:, idx].contiguous(),
        }
