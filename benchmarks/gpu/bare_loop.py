#!/usr/bin/env python
"""A bare PyTorch training loop of a dstui model preset: the MFU yardstick for runners/train.py.

Same model (configs/models/, random init, SDPA attention), same data (the runner's
tiny-corpus blocks), same FLOP count (dstui.core.hardware.flops_per_token) and the same
timing (a device synchronize after every optimizer step) as the bundled runner,
but no DeepSpeed. Two precisions:

* ``master``: bf16 weights and activations, fp32 master weights, fp32 gradients and
  fp32 AdamW (fused), gradient clipping 1.0 -- what DeepSpeed's bf16 ZeRO-0 path does.
* ``autocast``: fp32 weights, bf16 autocast, fused AdamW, clipping 1.0 -- the usual
  PyTorch AMP recipe.

Prints one JSON line (and writes it to --out): mean/std step time after warm-up,
tokens/s, TFLOP/s, MFU against the GPU's dense peak, peak memory, and the time of
the same steps run without any per-step synchronize (so the cost of the timing
sync itself is visible).

    CUDA_VISIBLE_DEVICES=0 python benchmarks/gpu/bare_loop.py --model llama-1b \\
        --seq-length 2048 --micro-batch 8 --steps 30 --warmup-steps 8 --mode master
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# runners/ import their siblings as top-level modules (they run as scripts from that folder)
for _p in (str(REPO), str(REPO / "runners")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import common  # noqa: E402
import corpus  # noqa: E402

from dstui.core.hardware import flops_per_token, peak_tflops  # noqa: E402


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="llama-1b")
    p.add_argument("--dataset", default="tiny-corpus")
    p.add_argument("--seq-length", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup-steps", type=int, default=8)
    p.add_argument(
        "--nosync-steps",
        type=int,
        default=10,
        help="extra steps timed as one block (no per-step sync)",
    )
    p.add_argument("--mode", choices=["master", "autocast", "fp32"], default="master")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--device", default=None, help="default: cuda when there is a GPU, else cpu")
    p.add_argument("--out", default=None, help="append the JSON result to this file")
    p.add_argument(
        "--profile", default=None, help="write the profiler's top ops of 5 more steps to this file"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    import torch

    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    on_gpu = dev.type == "cuda"
    common.seed_all(a.seed)
    config = common.model_config(a.model)
    layers, hidden, _, _, vocab = common.arch(config)
    config.use_cache = False
    t_build = time.perf_counter()
    model = common.build_model(a.model, config, load_weights=False, attn_implementation="sdpa")
    params = common.count_params(model)
    model.train()

    if a.mode == "master":
        model.to(device=dev, dtype=torch.bfloat16)
        work = [p for p in model.parameters() if p.requires_grad]
        master = [p.detach().float().clone() for p in work]
        for m in master:
            m.grad = torch.zeros_like(m)
        opt = torch.optim.AdamW(master, lr=a.lr, weight_decay=0.0, fused=on_gpu)
        opt_params = master
    else:
        model.to(device=dev)
        work = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(work, lr=a.lr, weight_decay=0.0, fused=on_gpu)
        opt_params = work
    build_s = time.perf_counter() - t_build

    tokens, _ = corpus.load_tokens(
        a.dataset,
        dataset_config=None,
        percent=100.0,
        model_name=a.model,
        vocab=vocab,
        seq_length=a.seq_length,
        samples_needed=(a.steps + a.nosync_steps) * a.micro_batch,
        seed=a.seed,
    )
    batches = iter(
        corpus.ShardedBatches(corpus.pack(tokens, a.seq_length), a.micro_batch, 1, 0, a.seed)
    )
    autocast = torch.autocast(
        device_type=dev.type, dtype=torch.bfloat16, enabled=a.mode == "autocast"
    )

    def step() -> torch.Tensor:
        batch = {k: v.to(dev, non_blocking=True) for k, v in next(batches).items()}
        with autocast:
            loss = model(**batch).loss
        loss.backward()
        if a.mode == "master":
            grads = [p.grad for p in work]
            torch._foreach_copy_([m.grad for m in master], grads)  # bf16 -> fp32 gradients
            for p in work:
                p.grad = None
        torch.nn.utils.clip_grad_norm_(opt_params, 1.0, foreach=True)  # no host sync
        opt.step()
        if a.mode == "master":
            torch._foreach_copy_([p.data for p in work], master)  # fp32 master -> bf16 weights
        else:
            opt.zero_grad(set_to_none=True)
        return loss.detach()

    def sync() -> None:
        if on_gpu:
            torch.cuda.synchronize()

    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(loss)
    t0 = time.perf_counter()
    for _ in range(a.nosync_steps):
        step()
    sync()
    nosync = (time.perf_counter() - t0) / max(a.nosync_steps, 1)

    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
        with profile(activities=acts) as prof:
            for _ in range(5):
                step()
            sync()
        sort = "self_device_time_total" if on_gpu else "self_cpu_time_total"
        Path(a.profile).write_text(
            prof.key_averages().table(sort_by=sort, row_limit=40, max_name_column_width=60)
        )

    timed = times[a.warmup_steps :] or times
    tok = a.micro_batch * a.seq_length
    fpt = flops_per_token(params, layers, hidden, a.seq_length)
    name = torch.cuda.get_device_name(dev) if on_gpu else "cpu"
    peak = peak_tflops(name, "bf16" if a.mode != "fp32" else "fp32")
    mean = statistics.fmean(timed)
    tflops = fpt * tok / mean / 1e12
    res = {
        "bench": "bare_loop",
        "mode": a.mode,
        "model": a.model,
        "params": params,
        "gpu": name,
        "seq_length": a.seq_length,
        "micro_batch": a.micro_batch,
        "steps": a.steps,
        "warmup_steps": a.warmup_steps,
        "build_s": build_s,
        "first_step_s": times[0],
        "iter_time_mean": mean,
        "iter_time_std": statistics.stdev(timed) if len(timed) > 1 else 0.0,
        "iter_time_nosync": nosync,
        "tokens_per_s": tok / mean,
        "tflops": tflops,
        "mfu": tflops / peak if peak else None,
        "peak_tflops": peak,
        "mem_peak": int(torch.cuda.max_memory_allocated(dev)) if on_gpu else None,
        "losses": [float(x) for x in losses],  # one sync, after the timing
        "torch": torch.__version__,
    }
    line = json.dumps(res)
    print(line, flush=True)
    if a.out:
        with open(a.out, "a") as fh:
            fh.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
