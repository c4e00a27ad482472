"""Where the runner builds its model: where it will live, and under ZeRO-3 already partitioned.

Three ways (``method`` in the header's ``model_init`` record):

* ``zero.Init`` (ZeRO-3): ``deepspeed.zero.Init`` creates each module's
  parameters on the rank's device, lets the module initialise them, and cuts
  them into this rank's partition as soon as the module's ``__init__`` returns
  (onto ``offload_param``'s device where the ds_config offloads parameters).
  No rank ever holds the whole model, and ``deepspeed.initialize`` has nothing
  left to partition.
* ``device`` (ZeRO 0-2 on an accelerator): created on the GPU directly (a
  ``torch.device`` context) rather than on the host and copied over: seconds
  saved for a 1B model. Its random init then comes from the device's
  generator (so does zero.Init's on a GPU): the same for every ZeRO stage and
  every run of a seed, but not the numbers a host-built model had.
* ``host``: on the CPU. CPU runs (host is the device), pretrained weights
  outside ZeRO-3, and ZeRO-3 with ``DSTUI_ZERO_INIT=0``: the old path, kept so
  that old and new can be compared side by side (tests/e2e/test_zero_init.py,
  benchmarks).

Same seed, same weights, bit for bit (on the CPU; tests/e2e/test_zero_init.py),
which takes two things that a plain ``zero.Init`` does not do:

1. zero.Init creates floating-point tensors in the training dtype. Random
   init drawn in bf16 is not fp32 init rounded to bf16, which is what
   ``deepspeed.initialize`` makes of a model built whole. So the model is
   built in fp32 (zero.Init gets a copy of the ds_config with half precision
   off) and the finished partitions are cast: one partition of each parameter
   at a time, never the whole model.
2. transformers initialises weights in ``post_init``, after the submodules are
   built; under zero.Init they are empty by then, so its ``normal_`` calls
   draw nothing and the constructors' kaiming draws would stay. transformers'
   own ZeRO-3 path (``initialize_weights_zero3``) gathers each module but
   skips the constructors' draws and draws on rank 0 only: different weights,
   and the other ranks' generators (dropout) out of step. Here
   ``_initialize_weights`` gathers the module's parameters (and its direct
   children's, as transformers' variant does) on every rank at the moment
   ``post_init`` calls it: the same draws in the same order on every rank as
   a whole-model build, so even the generator state afterwards is the same.

Pretrained weights (``--load-weights``) under ZeRO-3 go through transformers'
own integration: while it sees the ds_config (``is_deepspeed_zero3_enabled``)
``from_pretrained`` builds under zero.Init and loads each checkpoint tensor
straight into its partitions.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import os
import sys
from collections.abc import Iterator
from typing import Any

import common

# "0": build ZeRO-3 models whole on the host and let deepspeed.initialize partition them (the old path).
ENV = "DSTUI_ZERO_INIT"
# the ds_config's half-precision sections (bfloat16: bf16's alias)
_HALF = ("fp16", "bf16", "bfloat16")


def zero_stage(ds_config: dict[str, Any]) -> int:
    return int((ds_config.get("zero_optimization") or {}).get("stage", 0) or 0)


def train_dtype(ds_config: dict[str, Any]) -> Any:
    """The parameter dtype deepspeed.initialize casts the model to (None: fp32, no cast)."""
    import torch

    if (ds_config.get("fp16") or {}).get("enabled"):
        return torch.float16
    if any((ds_config.get(k) or {}).get("enabled") for k in _HALF[1:]):
        return torch.bfloat16
    return None


def method_of(
    args: argparse.Namespace, ds_config: dict[str, Any], *, on_cpu: bool
) -> tuple[str, str | None]:
    """(how this run builds its model, why not under zero.Init where ZeRO-3 would allow it)."""
    whole = "host" if on_cpu or args.load_weights else "device"
    if zero_stage(ds_config) != 3:
        return whole, None
    if os.environ.get(ENV, "1") == "0":
        return whole, f"{ENV}=0"
    offload = (ds_config.get("zero_optimization") or {}).get("offload_param") or {}
    if offload.get("device") == "nvme" and train_dtype(ds_config) is not None:
        # the fp32 build would go through an NVMe swapper sized for fp32 partitions
        return whole, "parameters offloaded to NVMe in half precision"
    if not args.load_weights and not _has_hf_init_hook():
        return whole, "this transformers has no PreTrainedModel._initialize_weights to gather for"
    return "zero.Init", None


def build(
    args: argparse.Namespace,
    config: Any,
    ds_config: dict[str, Any],
    *,
    accel: Any,
    on_cpu: bool,
    mpu: Any = None,
) -> tuple[Any, dict[str, Any]]:
    """The model, built where ``method_of`` says, and the header's ``model_init`` record."""
    method, why_not = method_of(args, ds_config, on_cpu=on_cpu)
    if why_not and int(os.environ.get("RANK", "0")) == 0:
        print(
            f"train.py: ZeRO-3 model built whole, not under zero.Init: {why_not}",
            file=sys.stderr,
            flush=True,
        )

    def make() -> Any:
        return common.build_model(
            args.model, config, load_weights=args.load_weights, attn_implementation="sdpa"
        )

    if method == "zero.Init":
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))  # zero.Init's device
    if method == "zero.Init" and args.load_weights:
        with _transformers_sees_zero3(ds_config):
            model = make()
    elif method == "zero.Init":
        with _zero_init(ds_config, mpu), _gathered_hf_init():
            model = make()
        _cast_partitions(model, train_dtype(ds_config), accel)
    elif method == "device":
        import torch

        with torch.device(accel.current_device_name()):
            model = make()
    else:
        model = make()
    record = {
        "method": method,
        "params": common.count_params(model),
        "params_on_rank": local_numel(model),
    }
    if why_not:
        record["zero_init_off"] = why_not
    return model, record


def local_numel(model: Any) -> int:
    """Parameter elements this rank holds: its partitions under ZeRO-3, everything otherwise."""
    total = 0
    for p in model.parameters():
        part = getattr(p, "ds_tensor", None)
        total += part.numel() if part is not None else p.numel()
    return total


def _zero_init(ds_config: dict[str, Any], mpu: Any) -> Any:
    """zero.Init over the ranks ZeRO-3 will partition over, creating tensors in fp32 (point 1 above).

    The ds_config brings the rest: offload_param's device and pinning (where
    partitions live), hpZ, quantized weights. With Ulysses sequence
    parallelism ZeRO-3 partitions over the sequence-data-parallel group, and
    the mpu tells DeepSpeed's config the data-parallel size.
    """
    import deepspeed

    fp32 = copy.deepcopy(ds_config)
    for key in _HALF:
        if isinstance(fp32.get(key), dict):
            fp32[key]["enabled"] = False
    kwargs: dict[str, Any] = {"config_dict_or_path": fp32}
    if mpu is not None:
        kwargs.update(mpu=mpu, data_parallel_group=mpu.get_sequence_data_parallel_group())
    return deepspeed.zero.Init(**kwargs)


def _has_hf_init_hook() -> bool:
    from transformers.modeling_utils import PreTrainedModel

    return hasattr(PreTrainedModel, "_initialize_weights")


def _init_params(module: Any) -> list[Any]:
    """The partitioned parameters ``_init_weights(module)`` may write: its own and its direct children's."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    from transformers.modeling_utils import PreTrainedModel

    params = {id(p): p for p in module.parameters(recurse=False)}
    for child in module.children():
        if not isinstance(child, PreTrainedModel):  # a sub-model initialises its own
            params.update((id(p), p) for p in child.parameters(recurse=False))
    # already gathered ones (an enclosing Module.apply under zero.Init) stay as they are
    return [
        p for p in params.values() if getattr(p, "ds_status", None) == ZeroParamStatus.NOT_AVAILABLE
    ]


@contextlib.contextmanager
def _gathered_hf_init() -> Iterator[None]:
    """transformers' per-module weight init on gathered parameters, on every rank (point 2 above).

    modifier_rank=0: the ranks draw the same numbers anyway; rank 0's are
    broadcast so that the partitions agree even if a kernel did not.
    """
    import deepspeed
    from transformers.modeling_utils import PreTrainedModel

    original = PreTrainedModel._initialize_weights

    @functools.wraps(original)
    def gathered(self: Any, module: Any, *args: Any, **kwargs: Any) -> Any:
        params = [] if getattr(module, "_is_hf_initialized", False) else _init_params(module)
        with deepspeed.zero.GatheredParameters(params, modifier_rank=0, enabled=bool(params)):
            return original(self, module, *args, **kwargs)

    PreTrainedModel._initialize_weights = gathered
    try:
        yield
    finally:
        PreTrainedModel._initialize_weights = original


def _cast_partitions(model: Any, dtype: Any, accel: Any) -> None:
    """Cast the fp32-built parameters to the training dtype, partition by partition.

    What deepspeed.initialize does to a model built whole (it leaves a
    zero.Init model as it finds it); buffers are left alone there too.
    """
    if dtype is None:
        return
    for p in model.parameters():
        if not p.is_floating_point() or p.dtype == dtype:
            continue
        p.data = p.data.to(dtype)  # empty, or whole for a parameter ZeRO keeps persistent
        part = getattr(p, "ds_tensor", None)
        if part is not None:
            pinned = part.is_pinned()
            part.data = part.data.to(dtype)
            if pinned:
                part.data = accel.pin_memory(part.data)


class _Zero3Config:
    """What transformers' ZeRO-3 integration reads of an ``HfDeepSpeedConfig``: ``config`` and ``is_zero3()``.

    HfDeepSpeedConfig itself needs accelerate, which the runner does not;
    transformers keeps only a weak reference, so the caller holds this one.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def is_zero3(self) -> bool:
        return zero_stage(self.config) == 3


@contextlib.contextmanager
def _transformers_sees_zero3(ds_config: dict[str, Any]) -> Iterator[None]:
    """transformers builds and loads under zero.Init while this is open (``is_deepspeed_zero3_enabled``).

    Closed right after the build: left open, a later ``from_config`` in this
    process (the sp-check's twin run) would take transformers' rank-0-only
    init instead of ours.
    """
    from transformers.integrations import set_hf_deepspeed_config, unset_hf_deepspeed_config

    holder = _Zero3Config(ds_config)
    set_hf_deepspeed_config(holder)
    try:
        yield
    finally:
        unset_hf_deepspeed_config()
