"""Ulysses sequence parallelism for the training runner, on DeepSpeed's own HF integration.

DeepSpeed's ``UlyssesSPAttentionHF.register_with_transformers`` swaps the
model's attention function (here ``sdpa``) for one that all-to-alls Q/K/V
from sequence shards to head shards and back, and returns the sequence-parallel
``mpu`` that ``deepspeed.initialize`` needs. ``UlyssesSPDataLoaderAdapter``
hands every rank of a sequence-parallel group its slice of the same sample.
The loss is then each shard's token sum, gathered differentiably over the
group and divided by the group's token count: the full-sequence mean, as the
DeepSpeed ALST tutorial prescribes. runners/ring.py reuses the data order and the loss.

SP groups are consecutive ranks (``parallel_state_sp``): ranks 0..S-1, S..2S-1, ...

With ``--sp-check`` a probe (runners/sp_probe.py) sees Q/K/V on both sides of the
all-to-all and the attention output on both sides of the reverse one. ``--sp-inject``
breaks the run on purpose, to prove the check catches it:

* ``head-split``: the value heads a rank holds after the all-to-all rotated by one
  (heads paired with another head's values, what a wrong all-to-all layout does);
* ``shard-offset``: each rank handed the next rank's sequence shard (the data split
  off by one shard, so the all-to-all reassembles the sequence in the wrong order).
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Iterator
from typing import Any

import sp_attention
from common import RunnerError
from corpus import ShardedBatches
from sp_probe import Place, Probe

# torch 2.13 deprecates the autograd-aware collectives of torch.distributed.nn in favour of
# functional collectives that have no autograd all_reduce (and whose all_gather's backward,
# a reduce-scatter, gloo lacks); the public ones still work on every backend, so keep them, quietly.
warnings.filterwarnings(
    "ignore", message=r"torch\.distributed\.nn\.functional\.all_reduce is deprecated"
)

# stage -> (words for the verdict, its tensors)
STAGES = {
    "shard": ("before the all-to-all", "qkv"),
    "exchanged": ("after the all-to-all", "qkv"),
    "attention": ("attention output", "o"),
    "returned": ("after the reverse all-to-all", "o"),
}


def check_shape(args: argparse.Namespace, heads: int, kv_heads: int) -> None:
    sp = args.sequence_parallel
    if heads % sp:
        raise RunnerError(f"--sequence-parallel {sp} must divide the model's {heads} attention heads")
    if not (kv_heads % sp == 0 or sp % kv_heads == 0):
        raise RunnerError(
            f"--sequence-parallel {sp} and the model's {kv_heads} KV heads must divide one another"
        )
    if args.seq_length % sp:
        raise RunnerError(f"--sequence-parallel {sp} must divide --seq-length {args.seq_length}")
    if getattr(args, "sp_inject", "none") == "head-split" and kv_heads // sp < 2:
        raise RunnerError(
            f"--sp-inject head-split rotates the value heads a rank holds: with {kv_heads} KV heads over "
            f"{sp} ranks each holds {max(1, kv_heads // sp)}, and a rotation would change nothing"
        )


def register(args: argparse.Namespace, config: Any, heads: int, kv_heads: int, probe: Probe | None) -> Any:
    """Install Ulysses attention for ``config``'s model family; return DeepSpeed's SP mpu."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    check_shape(args, heads, kv_heads)
    # The check compares the config's attention with the one being wrapped.
    config._attn_implementation = sp_attention.ATTN
    sdpa = sp_attention.plain()

    class _Loaded:  # register_with_transformers reads .config of a loaded model
        pass

    holder = _Loaded()
    holder.config = config  # type: ignore[attr-defined]
    inject = getattr(args, "sp_inject", "none")
    # DeepSpeed wraps whatever ALL_ATTENTION_FUNCTIONS holds under this name now: the core slot
    sp_attention.put(sp_attention.slot("ulysses_core", _injected(sdpa, inject)))
    mpu = UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=holder,
        core_attn_implementation=sp_attention.ATTN,
        sequence_parallel_size=args.sequence_parallel,
        micro_batch_size=args.micro_batch,
        seq_length=args.seq_length,
        seq_length_is_variable=False,
    )
    outer = sp_attention.current()  # DeepSpeed's all-to-all wrapper
    sp_attention.put(sp_attention.slot("ulysses_outer", outer))
    if probe is not None:
        _probe(probe, args, heads, kv_heads, mpu, sdpa, inject, outer)
    return mpu


def _injected(attention: Any, inject: str) -> Any:
    """The core attention, behind the all-to-all; with head-split, fed rotated value heads."""
    if inject != "head-split":
        return attention

    def broken(module: Any, query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        return attention(module, query, key, value.roll(1, dims=1), *args, **kwargs)

    return broken


def _places(args: argparse.Namespace, heads: int, kv_heads: int, rank: int) -> dict[str, dict[str, Place]]:
    """Stage -> tensor -> where SP rank ``rank``'s piece belongs in the no-SP tensor (DeepSpeed's split)."""
    sp = args.sequence_parallel
    local = args.seq_length // sp
    tokens = ((rank * local, (rank + 1) * local),)
    q_heads = tuple(range(rank * heads // sp, (rank + 1) * heads // sp))
    # KV heads are repeated when there are fewer than ranks (DeepSpeed's kv_replication_factor)
    rep = max(1, sp // kv_heads)
    local_kv = 1 if rep > 1 else kv_heads // sp
    kv_heads_of = tuple((rank * local_kv + j) // rep for j in range(local_kv))
    return {
        "shard": {n: Place(n, tokens) for n in "qkv"},
        "exchanged": {"q": Place("q", None, q_heads), "k": Place("k", None, kv_heads_of), "v": Place("v", None, kv_heads_of)},
        "attention": {"o": Place("o", None, q_heads)},
        "returned": {"o": Place("o", tokens)},
    }


def _probe(
    probe: Probe, args: argparse.Namespace, heads: int, kv_heads: int, mpu: Any, sdpa: Any, inject: str, outer: Any
) -> None:
    """Probed versions of both slots; ``probe.stop()`` puts the plain ones back."""
    places = _places(args, heads, kv_heads, mpu.get_sequence_parallel_rank())
    probe.stages.update(STAGES)
    core = sp_attention.probed(sdpa, probe, ("exchanged", places["exchanged"]), ("attention", places["attention"]["o"]))
    wrapped = sp_attention.probed(outer, probe, ("shard", places["shard"]), ("returned", places["returned"]["o"]))
    sp_attention.fill("ulysses_core", _injected(core, inject))
    sp_attention.fill("ulysses_outer", wrapped)

    def plain_again() -> None:
        sp_attention.fill("ulysses_core", _injected(sdpa, inject))
        sp_attention.fill("ulysses_outer", outer)

    probe.on_stop(plain_again)


def data(shard: ShardedBatches, accel: Any, args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """This rank's sequence slices: each SP peer's batch in turn (DeepSpeed's adapter)."""
    import deepspeed.runtime.sequence_parallel.parallel_state_sp as mpu
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter

    sp, rank = mpu.get_sequence_parallel_world_size(), mpu.get_sequence_parallel_rank()
    if getattr(args, "sp_inject", "none") == "shard-offset":
        rank = (rank + 1) % sp  # the adapter slices by this index only: the next rank's shard
    return UlyssesSPDataLoaderAdapter(
        shard,
        sp_rank=rank,
        sp_group=mpu.get_sequence_parallel_group(),
        sp_world_size=sp,
        device=accel.current_device_name(),
    )


def loss(engine: Any, batch: dict[str, Any]) -> Any:
    """Mean token loss of the whole sequence, the same on every rank of the SP group, differentiable."""
    import deepspeed.runtime.sequence_parallel.parallel_state_sp as mpu
    import torch
    import torch.distributed as dist
    import torch.distributed.nn.functional as dfn

    labels = batch.pop("shift_labels")
    logits = engine(**batch).logits
    local = torch.nn.functional.cross_entropy(
        logits.float().view(-1, logits.shape[-1]),
        labels.view(-1),
        ignore_index=-100,
        reduction="sum",
    )
    count = (labels != -100).sum().float()
    group = mpu.get_sequence_parallel_group()
    # An all-reduce, not DeepSpeed's tutorial's all_gather: the same sum and gradient (the backward
    # sums every rank's gradient), but torch's all_gather backward on gloo scatters from group
    # index i as if it were global rank i, which breaks every SP group but the first (sp x dp on CPU).
    total = dfn.all_reduce(local, group=group)
    dist.all_reduce(count, group=group)
    return total / count.clamp(min=1.0)


def reference_batches(
    shard: ShardedBatches, sp: int, rank: int, world: int
) -> Iterator[dict[str, Any]]:
    """Whole micro batches in the order the SP run's group saw them: peer 0's, peer 1's, ... then again.

    Every rank of a group trains on the same full sample, so the data-parallel
    mean over all ranks equals the SP run's mean over groups.
    """
    first = rank // sp * sp
    peers = [
        iter(ShardedBatches(shard.blocks, shard.micro_batch, world, p, shard.seed))
        for p in range(first, first + sp)
    ]
    while True:
        for it in peers:
            yield next(it)
