#!/usr/bin/env python
"""A bare DeepSpeed training script, as a user would write one: the yardstick for `dstui run`'s start-up (issue 31).

Plain torch + transformers + DeepSpeed, no dstui: the model from a config file,
built under ``torch.device("cuda")`` (random init on the GPU), one
``deepspeed.initialize`` with the given ds_config, random token batches, a
device synchronize after every optimizer step (as dstui's runner does), then
the process group left. Started as one rank by hand (RANK/WORLD_SIZE/
MASTER_ADDR/MASTER_PORT in the environment), as dstui starts its ranks.

It writes its wall-clock marks (unix times) as one JSON object to ``--marks``:
``process_start`` (from /proc), ``imports_done``, ``group_up``,
``model_built``, ``engine_ready``, ``first_step_done``, ``last_step_done``,
``exit``: the same names as the runner's ``phases`` record, so
benchmarks/gpu/bare_vs_dstui.py lays both side by side.

    RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 \\
        python benchmarks/gpu/bare_ds.py --model-config configs/models/llama-1b.json \\
        --ds-config ds.json --seq-length 2048 --micro-batch 4 --steps 10 --marks marks.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def process_start() -> float:
    """When the kernel started this process (unix time): /proc/self/stat's start tick against /proc/uptime."""
    try:
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        return time.time() - max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


def main() -> int:
    marks = {"process_start": process_start()}
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-config", required=True, help="a transformers config.json (model_type + shape)")
    p.add_argument("--ds-config", required=True)
    p.add_argument("--seq-length", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--torch-adam", action="store_true", help="torch's AdamW as client optimizer (CPU)")
    p.add_argument("--marks", required=True, help="write the marks here (JSON)")
    p.add_argument("--runner-inputs", action="store_true",
                   help="feed the model as dstui's runner does: labels a copy, explicit position ids")  # fmt: skip
    a = p.parse_args()

    import random

    import deepspeed
    import numpy as np
    import torch
    import transformers
    from deepspeed.accelerator import get_accelerator

    marks["imports_done"] = time.time()
    deepspeed.init_distributed()
    marks["group_up"] = time.time()
    accel = get_accelerator()
    device = torch.device(accel.current_device_name())
    # what transformers.set_seed does, without importing transformers.trainer_utils (and peft through it)
    random.seed(a.seed)
    np.random.seed(a.seed)
    torch.manual_seed(a.seed)
    torch.cuda.manual_seed_all(a.seed)
    cfg = json.loads(Path(a.model_config).read_text())
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    config.use_cache = False
    with device:  # random init on the GPU: no host build, no copy
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    marks["model_built"] = time.time()
    ds_config = json.loads(Path(a.ds_config).read_text())
    kwargs = {"model": model, "config": ds_config}
    if a.torch_adam or "optimizer" not in ds_config:
        kwargs["optimizer"] = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    else:
        kwargs["model_parameters"] = [q for q in model.parameters() if q.requires_grad]
    engine, *_ = deepspeed.initialize(**kwargs)
    gen = torch.Generator().manual_seed(a.seed)
    ids = torch.randint(0, config.vocab_size, (a.steps, a.micro_batch, a.seq_length), generator=gen)
    marks["engine_ready"] = time.time()

    losses = []
    pos = torch.arange(a.seq_length).unsqueeze(0).expand(a.micro_batch, -1).contiguous()
    for step in range(a.steps):
        batch = ids[step].to(device, non_blocking=True)
        if a.runner_inputs:
            extra = {"labels": ids[step].clone().to(device, non_blocking=True),
                     "position_ids": pos.to(device, non_blocking=True)}  # fmt: skip
        else:
            extra = {"labels": batch}
        loss = engine(input_ids=batch, **extra).loss
        engine.backward(loss)
        engine.step()
        accel.synchronize()
        losses.append(loss.detach())
        if step == 0:
            marks["first_step_done"] = time.time()
    marks["last_step_done"] = time.time()
    final = [float(x) for x in losses]
    deepspeed.comm.destroy_process_group()
    marks["exit"] = time.time()
    with open(a.marks, "w") as fh:
        json.dump({"marks": marks, "losses": final, "device": str(device)}, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
