"""Memory per GPU from a model's shape, before anything is launched.

Three parts, each in bytes per GPU:

* **model states** (parameters, gradients, optimizer states): DeepSpeed's own
  estimators, the functions its ``estimate_zero{2,3}_model_states_mem_needs_all_cold``
  tables are printed from. "Cold" needs only parameter counts, which come from
  the model preset's config (``configs/models/``) without building the model.
* **activations**: an analytic transformer estimate (what backward keeps per
  token; see :func:`analytic_activations`). :mod:`dstui.analysis.forecast`
  replaces it with a least-squares fit when MLflow holds earlier GPU runs.
* **framework overhead**: DeepSpeed's communication buckets and ZeRO-3's
  live-parameter budget, read from the run's ds_config (defaults as DeepSpeed's).

The peak is the larger of two moments, because not everything lives at once
(measured on an H200: `docs/gpu-validation/README.md`): the end of the forward
pass, where the activations are all alive but the gradients do not exist yet
(:func:`forward_free`), and the optimizer step, where the activations are gone
but the gradients, and ZeRO-0's flattened fp32 copies (:func:`step_extra`), are.

Nothing here imports torch; DeepSpeed is imported inside :func:`model_states`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dstui.core import ds_answers
from dstui.core.paths import CONFIGS_DIR

MODELS_DIR = CONFIGS_DIR / "models"
GIB = 2**30
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# DeepSpeed's defaults (deepspeed.runtime.zero.config) for the buffers we count
DEFAULT_REDUCE_BUCKET = 500_000_000
DEFAULT_PREFETCH_BUCKET = 50_000_000
DEFAULT_MAX_LIVE_PARAMETERS = 1_000_000_000
# cuBLAS workspaces, the loss's scalars, allocator rounding: a fixed allowance
FIXED_OVERHEAD = 256 * 2**20


@dataclass(frozen=True)
class ModelShape:
    """What memory depends on: sizes of a decoder-only transformer."""

    family: str  # model_type, e.g. "llama"
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    positions: int
    tied: bool

    @property
    def kv_dim(self) -> int:
        return self.hidden // self.heads * self.kv_heads

    @property
    def layer_params(self) -> int:
        h, i = self.hidden, self.intermediate
        if self.family == "gpt2":  # biases, two LayerNorms, a 4h MLP
            return (h * 3 * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h) + 4 * h
        return 2 * h * h + 2 * h * self.kv_dim + 3 * h * i + 2 * h  # Llama: q,o,k,v, SwiGLU, 2 RMSNorms

    @property
    def params(self) -> int:
        h = self.hidden
        embed = self.vocab * h
        if self.family == "gpt2":
            extra = self.positions * h + 2 * h  # position embeddings, final LayerNorm
        else:
            extra = h  # final RMSNorm
        head = 0 if self.tied else self.vocab * h
        return embed + head + extra + self.layers * self.layer_params

    @property
    def largest_layer_params(self) -> int:
        """The biggest single module's own parameters: what ZeRO-3 gathers at once.

        As DeepSpeed's ``model_to_params`` counts it (a module's parameters, not its
        children's): the token embedding, usually; GPT-2's position embedding or
        fused qkv projection can be larger for tiny vocabularies.
        """
        h, i = self.hidden, self.intermediate
        if self.family == "gpt2":
            return max(self.vocab * h, self.positions * h, h * 3 * h + 3 * h, h * i + i)
        return max(self.vocab * h, h * i, h * h)


def model_config(model: str) -> dict[str, Any] | None:
    """The HF config of a preset or a local folder; None for a hub id (no network here)."""
    for path in (MODELS_DIR / f"{model}.json", Path(model) / "config.json", Path(model)):
        if path.is_file() and path.suffix == ".json":
            try:
                return json.loads(path.read_text())
            except ValueError:
                return None
    return None


def model_shape(model: str) -> ModelShape | None:
    """The shape of a preset (or local config); None when it cannot be known offline."""
    cfg = model_config(model)
    if not cfg:
        return None

    def get(*names: str, default: Any = None) -> Any:
        return next((cfg[n] for n in names if cfg.get(n) is not None), default)

    hidden = get("hidden_size", "n_embd", "d_model")
    layers = get("num_hidden_layers", "n_layer")
    heads = get("num_attention_heads", "n_head")
    vocab = get("vocab_size")
    if not all(isinstance(x, int) for x in (hidden, layers, heads, vocab)):
        return None
    family = str(cfg.get("model_type", "llama"))
    return ModelShape(
        family=family,
        vocab=vocab,
        hidden=hidden,
        intermediate=get("intermediate_size", "n_inner", default=4 * hidden),
        layers=layers,
        heads=heads,
        kv_heads=get("num_key_value_heads", default=heads),
        positions=get("max_position_embeddings", "n_positions", default=0),
        tied=bool(get("tie_word_embeddings", default=family == "gpt2")),
    )


def model_states(
    shape: ModelShape, *, zero_stage: int, offload: str, offload_params: str, dtype: str, gpus: int, nodes: int
) -> int:
    """Parameters + gradients + optimizer states per GPU, from DeepSpeed's estimators.

    DeepSpeed's formulas assume 16-bit training (2-byte parameters and
    gradients, fp32 master copy and Adam moments). ZeRO-1 has no estimator of
    its own and keeps what ZeRO-2's formula counts, so it uses that one.
    ZeRO-0 has none either: its FP16_Optimizer (bf16 too) holds 16-bit weights
    and gradients, the fp32 master and the Adam moments, 2 + 2 + 4 + 8 bytes per
    parameter, DeepSpeed's own terms without partitioning; the fp32 gradient
    copy it makes inside ``step()`` exists only once the activations are freed.
    fp32 training adds the difference of the 16-bit terms; fp32 without ZeRO
    is plain PyTorch (4 + 4 + 8 bytes per parameter): 16 bytes as well.
    """
    p = shape.params
    total = gpus * nodes
    cpu_offload = offload != "none" or offload_params != "none"
    if zero_stage == 0:
        return 16 * p
    if zero_stage in (1, 2):
        gpu = _zero2_states(p, gpus, nodes, cpu_offload)
        if dtype == "fp32":  # 4-byte instead of 2-byte parameters, and gradients when on the GPU
            gpu += 2 * p if cpu_offload else 2 * p + 2 * p // total
        return gpu
    gpu = _zero3_states(p, shape.largest_layer_params, gpus, nodes, cpu_offload, offload_params != "none")
    if dtype == "fp32" and offload_params == "none":
        gpu += 2 * p // total
    return gpu


def _zero2_states(params: int, gpus: int, nodes: int, cpu_offload: bool) -> int:
    """DeepSpeed's ZeRO-1/2 estimator (GPU bytes), remembered per install: it costs a DeepSpeed import."""

    def ask() -> int:
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        return int(estimate_zero2_model_states_mem_needs(params, gpus, nodes, cpu_offload=cpu_offload)[1])

    return ds_answers.remembered("zero2-states", [params, gpus, nodes, cpu_offload], ask)


def _zero3_states(params: int, largest_layer: int, gpus: int, nodes: int, cpu_offload: bool, offload_params: bool) -> int:
    """DeepSpeed's ZeRO-3 estimator (GPU bytes), remembered per install like :func:`_zero2_states`."""

    def ask() -> int:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

        return int(estimate_zero3_model_states_mem_needs(
            params, largest_layer, gpus, nodes, cpu_offload=cpu_offload, cpu_offload_params=offload_params)[1])  # fmt: skip

    return ds_answers.remembered("zero3-states", [params, largest_layer, gpus, nodes, cpu_offload, offload_params], ask)


def forward_free(
    shape: ModelShape, *, zero_stage: int, offload: str, offload_params: str, dtype: str, gpus: int, nodes: int
) -> int:
    """The part of :func:`model_states` that does not exist yet while forward runs: the gradients.

    ZeRO-0: the 16-bit gradients. ZeRO-1/2 on the GPU: the 16-bit gradients
    and the fp32 gradient partition (DeepSpeed's ``4P + 16P/N`` is parameters,
    gradients, and master + moments + fp32 gradients). ZeRO-3: the 16-bit
    gradient partition (its fp32 gradient partition is allocated up front).
    With the optimizer offloaded, gradients go to the host.
    """
    p, e = shape.params, DTYPE_BYTES.get(dtype, 4)
    n = gpus * nodes
    if offload != "none" or (zero_stage == 3 and offload_params != "none"):
        return 0
    if zero_stage == 0:
        return e * p
    if zero_stage in (1, 2):
        return e * p + 4 * p // n
    return e * p // n


def step_extra(shape: ModelShape, *, zero_stage: int, dtype: str) -> int:
    """Memory the optimizer step adds on top of the model states.

    ZeRO-0 with 16-bit weights (DeepSpeed's FP16_Optimizer, bf16 too) flattens
    the gradients and casts the flat copy to fp32 inside ``step()``: its peak
    was 24 bytes per parameter on an H200 (llama-1b, 1 GPU), 8 more than its
    16 bytes of states. The ZeRO optimizers keep their fp32 gradient partition
    in the states already.
    """
    if zero_stage == 0 and dtype in ("bf16", "fp16"):
        return 8 * shape.params
    return 0


def analytic_activations(
    shape: ModelShape, *, seq_length: int, micro_batch: int, dtype: str, checkpointing: bool, sequence_parallel: int = 1
) -> int:
    """What backward keeps from forward, per GPU, in bytes (a by-hand transformer count).

    Per layer and token, in the training dtype: the attention input, q/k/v,
    the attention output and the o-projection input (``6h + 2 kv``), and the
    MLP's gate, up, activation and product (``4i``); plus the two norms' fp32
    inputs (``8h``). Attention scores are not kept (SDPA/flash attention).
    With checkpointing only each layer's input stays, plus one layer being
    recomputed. The logits are kept in the dtype, in fp32 for the loss and as
    the loss's fp32 gradient (``V (e + 8)``). Ulysses splits the sequence.
    """
    e = DTYPE_BYTES.get(dtype, 4)
    tokens = seq_length * micro_batch
    local = tokens // max(1, sequence_parallel)
    h, i = shape.hidden, shape.intermediate
    per_layer = local * (e * (6 * h + 2 * shape.kv_dim + 4 * i) + 8 * h)
    layers = local * e * h * shape.layers + per_layer if checkpointing else per_layer * shape.layers
    logits = tokens * shape.vocab * (e + 8)
    return layers + logits


def framework_overhead(
    shape: ModelShape, *, zero_stage: int, dtype: str, ds_config: dict[str, Any] | None, ranks: int
) -> int:
    """DeepSpeed's own buffers: gradient buckets, and ZeRO-3's prefetch and live parameters.

    A ZeRO-3 parameter gathered for use costs its full size less the partition
    the rank holds anyway: ``(1 - 1/ranks)`` of it (nothing on one GPU).
    """
    e = DTYPE_BYTES.get(dtype, 4)
    zero = (ds_config or {}).get("zero_optimization") or {}
    p = shape.params
    if zero_stage == 0:
        return FIXED_OVERHEAD
    bucket = min(int(zero.get("reduce_bucket_size", DEFAULT_REDUCE_BUCKET)), p) * e
    if zero_stage in (1, 2):
        return FIXED_OVERHEAD + bucket
    live = min(int(zero.get("stage3_max_live_parameters", DEFAULT_MAX_LIVE_PARAMETERS)), p)
    prefetch = min(int(zero.get("stage3_prefetch_bucket_size", DEFAULT_PREFETCH_BUCKET)), p)
    return FIXED_OVERHEAD + bucket + (live + prefetch) * e * (ranks - 1) // max(1, ranks)
