#!/usr/bin/env python
"""A bare DeepSpeed training script for DeepSpeed's own autotuner (issue 42's comparison with `dstui tune`).

What `deepspeed --autotuning run` needs of a user's script: DeepSpeed's config
arguments (``--deepspeed_config``: the autotuner hands each experiment its own
file), ``deepspeed.initialize(args=...)``, and a training loop long enough for
the engine to reach the autotuner's end profile step, where the engine records
its metric and exits by itself. The batch comes from the engine (the
experiment's micro batch). No dstui, no mlflow: the autotuner crashes with
``KeyError: 'MLFLOW_RUN_ID'`` whenever mlflow is importable (DeepSpeed 0.19.8).

    deepspeed --autotuning run --num_gpus 1 benchmarks/gpu/autotune_bare.py \\
        --model-config configs/models/llama-1b.json --seq-length 2048 --deepspeed_config ds_autotune.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> int:
    import deepspeed
    import torch
    import transformers

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-config", required=True, help="a transformers config.json (model_type + shape)")
    p.add_argument("--seq-length", type=int, default=2048)
    p.add_argument("--steps", type=int, default=1000, help="more than the autotuner's end profile step")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--local_rank", type=int, default=0)
    p = deepspeed.add_config_arguments(p)
    a = p.parse_args()

    deepspeed.init_distributed()
    torch.manual_seed(a.seed)
    device = torch.device("cuda", a.local_rank) if torch.cuda.is_available() else torch.device("cpu")
    cfg = json.loads(Path(a.model_config).read_text())
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    config.use_cache = False
    with device:
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    engine, *_ = deepspeed.initialize(args=a, model=model, model_parameters=[q for q in model.parameters()])
    mb = engine.train_micro_batch_size_per_gpu()
    gen = torch.Generator().manual_seed(a.seed)
    for _ in range(a.steps * engine.gradient_accumulation_steps()):
        batch = torch.randint(0, config.vocab_size, (mb, a.seq_length), generator=gen).to(device)
        loss = engine(input_ids=batch, labels=batch).loss
        engine.backward(loss)
        engine.step()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
