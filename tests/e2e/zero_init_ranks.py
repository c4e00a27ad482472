"""Rank program of tests/e2e/test_zero_init.py: each preset built whole and under zero.Init, compared bit for bit.

Started on 2 gloo ranks by dstui.execute.injob.ranks. For every case it builds the
model twice through runners/placement.py, the old way (DSTUI_ZERO_INIT=0:
whole, on the host, cast the way deepspeed.initialize casts it) and the new
way (partitioned under zero.Init), gathers the new one and compares every
parameter and buffer, and the random generator's state afterwards (what
dropout draws from next). Rank 0 prints one JSON line per case, each field
ANDed over the ranks.

    python tests/e2e/zero_init_ranks.py OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "runners"), str(REPO)]

import common  # noqa: E402

common.isolate_op_cache()  # the runners' JIT-op folder
import deepspeed  # noqa: E402
import placement  # noqa: E402
import process_group  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from deepspeed.accelerator import get_accelerator  # noqa: E402

PRESETS = ("tiny-llama", "tiny-llama-shared", "tiny-gpt2", "tiny-t5")


def ds_config(dtype: str) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3},
        "bf16": {"enabled": dtype == "bf16"},
    }


def build(
    model: str, dtype: str, *, load_weights: bool, zero_init: bool
) -> tuple[Any, dict[str, Any]]:
    os.environ[placement.ENV] = "1" if zero_init else "0"
    args = argparse.Namespace(
        model=model, load_weights=load_weights, local_rank=int(os.environ["LOCAL_RANK"])
    )
    transformers.set_seed(7)
    config = common.model_config(model)
    cfg = ds_config(dtype)
    m, record = placement.build(args, config, cfg, accel=get_accelerator(), on_cpu=True)
    if not zero_init:  # what deepspeed.initialize does to a model built whole
        half = placement.train_dtype(cfg)
        for p in m.parameters():
            if half is not None:
                p.data = p.data.to(half)
    return m, record


def full_state(m: Any) -> dict[str, Any]:
    out = {}
    for name, p in m.named_parameters():
        with deepspeed.zero.GatheredParameters([p], enabled=hasattr(p, "ds_id")):
            out[name] = p.detach().clone()
    out.update((f"buffer:{n}", b.clone()) for n, b in m.named_buffers())
    return out


def all_ranks(flag: bool) -> bool:
    t = torch.tensor([int(flag)])
    deepspeed.comm.all_reduce(t, op=deepspeed.comm.ReduceOp.MIN)
    return bool(t.item())


def compare(case: str, model: str, dtype: str, *, load_weights: bool = False) -> None:
    old, _ = build(model, dtype, load_weights=load_weights, zero_init=False)
    old_state, old_rng = full_state(old), torch.get_rng_state()
    new, record = build(model, dtype, load_weights=load_weights, zero_init=True)
    new_rng = torch.get_rng_state()
    partitioned = all(hasattr(p, "ds_id") for p in new.parameters())
    new_state = full_state(new)
    differ = sorted(
        k for k in old_state
        if k not in new_state or old_state[k].dtype != new_state[k].dtype
        or not torch.equal(old_state[k], new_state[k])
    )  # fmt: skip
    result = {
        "case": case,
        "method": record["method"],
        "partitioned": all_ranks(partitioned and record["params_on_rank"] < record["params"]),
        "identical": all_ranks(not differ and old_state.keys() == new_state.keys()),
        "rng_same": all_ranks(torch.equal(old_rng, new_rng)),
        "differ": differ[:5],
    }
    if deepspeed.comm.get_rank() == 0:
        print(json.dumps(result), flush=True)


def main() -> None:
    out = Path(next(a for a in sys.argv[1:] if not a.startswith("--")))
    # as the runners start it: without the JIT build of DeepSpeed's CPU shm op, which no step here
    # uses and which only this program still built in the suite (past the test's 600 s under load)
    process_group.init_distributed()
    for dtype in ("fp32", "bf16"):
        for preset in PRESETS:
            compare(f"{preset}/{dtype}", preset, dtype)
    # Pretrained weights: a tiny checkpoint saved here, loaded by transformers under zero.Init.
    ckpt = out / "tiny-llama-ckpt"
    if deepspeed.comm.get_rank() == 0:
        transformers.set_seed(11)
        config = common.model_config("tiny-llama")
        common.build_model(
            "tiny-llama", config, load_weights=False, attn_implementation="sdpa"
        ).save_pretrained(ckpt)
    deepspeed.comm.barrier()
    for dtype in ("fp32", "bf16"):
        compare(f"load-weights/{dtype}", str(ckpt), dtype, load_weights=True)


if __name__ == "__main__":
    main()
