#!/usr/bin/env python
"""Where the bundled runner synchronises host and device, and where its step time goes.

Runs one DeepSpeed engine of ``runners/train.py`` (its own ``Trainer``, so the
exact code path of the runner) in a single process on one GPU and compares two
ways of driving the same engine:

* ``runner``: ``Trainer.step()`` + ``Trainer.global_loss()`` + the memory/lr
  reads of a logged step -- what train.py does on every step with log_interval 1;
* ``engine``: forward/backward/step only, never synchronising (the floor: what
  DeepSpeed itself does).

Two independent counts of synchronisations per step:

1. ``torch.cuda.set_sync_debug_mode("warn")``: torch warns on every implicit
   synchronising operation (``.item()``, device-to-host copies, ``nonzero``...);
   each warning is attributed to the first stack frame in deepspeed/, runners/,
   transformers/ or torch/.
2. the PyTorch profiler: CUDA runtime calls ``cudaDeviceSynchronize``,
   ``cudaStreamSynchronize``, ``cudaEventSynchronize``, ``cudaMemcpy`` and the
   ``aten::_local_scalar_dense`` op (what ``.item()`` runs).

With ``--tables DIR`` it also writes the profiler's top ops by device time for
the engine steps (to compare with ``bare_loop.py --profile``).

    CUDA_VISIBLE_DEVICES=0 python benchmarks/gpu/sync_profile.py --model llama-1b \\
        --zero-stage 0 --micro-batch 8 --out sync.json --tables prof/
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# runners/ import their siblings as top-level modules (they run as scripts from that folder)
for _p in (str(REPO), str(REPO / "runners")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

SYNC_CALLS = (
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "aten::_local_scalar_dense",
)
ORIGINS = ("/runners/", "/benchmarks/", "/deepspeed/", "/transformers/", "/torch/")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="llama-1b")
    p.add_argument("--dataset", default="tiny-corpus")
    p.add_argument("--seq-length", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--zero-stage", type=int, default=0)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=8, help="steps per measurement")
    p.add_argument("--out", default=None)
    p.add_argument("--tables", default=None, help="folder for profiler tables")
    return p.parse_args(argv)


def _origin(stack: list[traceback.FrameSummary]) -> str:
    """The innermost frame in a project we care about (skipping this file and warnings)."""
    for fr in reversed(stack):
        f = fr.filename.replace("\\", "/")
        if f.endswith("sync_profile.py") or "/warnings.py" in f:
            continue
        if any(o in f for o in ORIGINS[:4]):
            short = f[f.rfind("/", 0, f.rfind("/")) + 1 :]
            return f"{short}:{fr.lineno} {fr.name}"
    fr = stack[-1]
    return f"{fr.filename}:{fr.lineno}"


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])

    import common
    import train_args
    import trainer

    targv = [
        "--model", a.model, "--dataset", a.dataset, "--seq-length", str(a.seq_length),
        "--micro-batch", str(a.micro_batch), "--zero-stage", str(a.zero_stage), "--dtype", a.dtype,
        "--steps", str(a.warmup + 4 * a.steps + 2), "--warmup-steps", "1", "--log-interval", "1",
    ]  # fmt: skip
    args = train_args.build_parser().parse_args(targv)
    ds_config = train_args.ds_config_of(args, train_args.settings_of(args))
    common.isolate_op_cache()
    import deepspeed
    import torch
    from deepspeed.accelerator import get_accelerator

    accel = get_accelerator()
    on_gpu = accel.device_name() != "cpu"
    if on_gpu:
        accel.set_device(0)
    deepspeed.init_distributed()
    tr = trainer.Trainer(args, ds_config, use_sp=False)

    def runner_step() -> float:
        dt, total = tr.step()
        tr.global_loss(total)
        tr.memory()
        tr.lr()
        return dt

    def engine_step() -> None:
        batch = {k: v.to(tr.device, non_blocking=True) for k, v in next(tr.batches).items()}
        loss = tr.loss_of(batch)
        tr.engine.backward(loss)
        tr.engine.step()

    for _ in range(a.warmup):
        runner_step()

    res: dict = {
        "bench": "sync_profile", "model": a.model, "zero_stage": a.zero_stage, "dtype": a.dtype,
        "micro_batch": a.micro_batch, "seq_length": a.seq_length, "steps": a.steps,
        "gpu": tr.dev["gpu_name"], "torch": torch.__version__, "deepspeed": deepspeed.__version__,
    }  # fmt: skip

    # 1. torch's sync debug mode, attributed to call sites
    if on_gpu:
        for name, fn in (("runner", runner_step), ("engine", engine_step)):
            sites: collections.Counter = collections.Counter()
            old = warnings.showwarning

            def hook(message, category, filename, lineno, file=None, line=None, _s=sites):  # noqa: ANN001
                if "synchronizing" in str(message):
                    _s[_origin(traceback.extract_stack()[:-1])] += 1

            warnings.showwarning = hook
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.showwarning = hook
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    for _ in range(a.steps):
                        fn()
                finally:
                    torch.cuda.set_sync_debug_mode(0)
            warnings.showwarning = old
            accel.synchronize()
            res[f"{name}_implicit_syncs_per_step"] = sum(sites.values()) / a.steps
            res[f"{name}_implicit_sync_sites"] = {k: v / a.steps for k, v in sites.most_common()}

    # 2. the profiler: sync calls per step, and the time
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    for name, fn in (("runner", runner_step), ("engine", engine_step)):
        accel.synchronize()
        with profile(activities=acts) as prof:
            for _ in range(a.steps):
                fn()
            accel.synchronize()
        counts = collections.Counter()
        kernels = 0
        for ev in prof.events():
            if ev.name in SYNC_CALLS:
                counts[ev.name] += 1
            if (
                on_gpu
                and getattr(ev, "device_type", None) is not None
                and str(ev.device_type).endswith("CUDA")
            ):
                kernels += 1
        # the trailing synchronize of the measurement itself is not the loop's
        counts["cudaDeviceSynchronize"] -= 1 if on_gpu else 0
        res[f"{name}_profiled_syncs_per_step"] = {
            k: v / a.steps for k, v in sorted(counts.items()) if v
        }
        res[f"{name}_device_events_per_step"] = kernels / a.steps
        if a.tables and name == "engine":
            Path(a.tables).mkdir(parents=True, exist_ok=True)
            sort = "self_device_time_total" if on_gpu else "self_cpu_time_total"
            (Path(a.tables) / f"engine_z{a.zero_stage}_top_ops.txt").write_text(
                prof.key_averages().table(sort_by=sort, row_limit=40, max_name_column_width=60)
            )

    # 3. plain timing: per-step synced (runner) vs a block of unsynced engine steps
    times = [runner_step() for _ in range(a.steps)]
    accel.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        engine_step()
    accel.synchronize()
    res["runner_iter_time_mean"] = statistics.fmean(times)
    res["engine_nosync_iter_time"] = (time.perf_counter() - t0) / a.steps
    res["mem_peak"] = tr.memory()[1]
    line = json.dumps(res)
    print(line, flush=True)
    if a.out:
        with open(a.out, "a") as fh:
            fh.write(line + "\n")
    deepspeed.comm.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
