"""Ulysses sequence parallelism for the training runner, on DeepSpeed's own HF integration.

DeepSpeed's ``UlyssesSPAttentionHF.register_with_transformers`` swaps the
model's attention function (here ``sdpa``) for one that all-to-alls Q/K/V
from sequence shards to head shards and back, and returns the sequence-parallel
``mpu`` that ``deepspeed.initialize`` needs. ``UlyssesSPDataLoaderAdapter``
hands every rank of a sequence-parallel group its slice of the same sample.
The loss is then each shard's token sum, gathered differentiably over the
group and divided by the group's token count: the full-sequence mean, as the
DeepSpeed ALST tutorial prescribes.

SP groups are consecutive ranks (``parallel_state_sp``): ranks 0..S-1, S..2S-1, ...
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Iterator
from typing import Any

from common import RunnerError
from corpus import ShardedBatches

# torch 2.13 deprecates the autograd-aware all_gather in favour of a private
# API; the public one is what DeepSpeed's tutorial uses, so keep it, quietly.
warnings.filterwarnings(
    "ignore", message=r"torch\.distributed\.nn\.functional\.all_gather is deprecated"
)

_ATTN = "sdpa"
_saved_attention: Any = None


def register(args: argparse.Namespace, config: Any, heads: int, kv_heads: int) -> Any:
    """Install Ulysses attention for ``config``'s model family; return DeepSpeed's SP mpu."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    global _saved_attention
    sp = args.sequence_parallel
    if heads % sp:
        raise RunnerError(
            f"--sequence-parallel {sp} must divide the model's {heads} attention heads"
        )
    if not (kv_heads % sp == 0 or sp % kv_heads == 0):
        raise RunnerError(
            f"--sequence-parallel {sp} and the model's {kv_heads} KV heads must divide one another"
        )
    if args.seq_length % sp:
        raise RunnerError(f"--sequence-parallel {sp} must divide --seq-length {args.seq_length}")
    # The check compares the config's attention with the one being wrapped.
    config._attn_implementation = _ATTN
    if _saved_attention is None:
        _saved_attention = ALL_ATTENTION_FUNCTIONS[_ATTN]

    class _Loaded:  # register_with_transformers reads .config of a loaded model
        pass

    holder = _Loaded()
    holder.config = config  # type: ignore[attr-defined]
    # DeepSpeed wraps whatever ALL_ATTENTION_FUNCTIONS holds under this name now.
    ALL_ATTENTION_FUNCTIONS[_ATTN] = _saved_attention
    if getattr(args, "sp_inject", "none") == "head-split":
        ALL_ATTENTION_FUNCTIONS[_ATTN] = _rotated_value_heads(_saved_attention)
    return UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=holder,
        core_attn_implementation=_ATTN,
        sequence_parallel_size=sp,
        micro_batch_size=args.micro_batch,
        seq_length=args.seq_length,
        seq_length_is_variable=False,
    )


def _rotated_value_heads(attention: Any) -> Any:
    """A deliberately wrong head split: each rank's value heads rotated by one after the all-to-all.

    The bug a broken all-to-all makes (heads paired with another head's values);
    for the tests that prove the sp-check catches one.
    """

    def broken(module: Any, query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        return attention(module, query, key, value.roll(1, dims=1), *args, **kwargs)

    return broken


def reset() -> None:
    """Put the plain attention back (the --sp-check reference run must not all-to-all)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if _saved_attention is not None:
        ALL_ATTENTION_FUNCTIONS[_ATTN] = _saved_attention


def data(shard: ShardedBatches, accel: Any) -> Iterator[dict[str, Any]]:
    """This rank's sequence slices: each SP peer's batch in turn (DeepSpeed's adapter)."""
    import deepspeed.runtime.sequence_parallel.parallel_state_sp as mpu
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter

    return UlyssesSPDataLoaderAdapter(
        shard,
        sp_rank=mpu.get_sequence_parallel_rank(),
        sp_group=mpu.get_sequence_parallel_group(),
        sp_world_size=mpu.get_sequence_parallel_world_size(),
        device=accel.current_device_name(),
    )


def loss(engine: Any, batch: dict[str, Any]) -> Any:
    """Mean token loss of the whole sequence, the same on every rank of the SP group, differentiable."""
    import deepspeed.runtime.sequence_parallel.parallel_state_sp as mpu
    import torch
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
    sums = dfn.all_gather(local, group=group)
    counts = dfn.all_gather(count, group=group)
    return torch.stack(list(sums)).sum() / torch.stack(list(counts)).sum().clamp(min=1.0)


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
