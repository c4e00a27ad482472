#!/usr/bin/env python
"""dstui's bundled training runner: one DeepSpeed job, measured the same way every time.

Started one process per rank, by dstui's rank starter (single node) or DeepSpeed's launcher::

    python -m dstui.execute.injob.ranks --nproc 2 --master-port 29500 -- \\
        python runners/train.py --model tiny-llama --zero-stage 3 --steps 10
    python -m deepspeed.launcher.runner --num_gpus 2 --master_port 29500 \\
        runners/train.py --model tiny-llama --zero-stage 3 --steps 10

Its arguments are the dash-form of the dstui ``Settings`` fields
(dstui/spec/flags.py), so a RunSpec maps onto an argv one to one. Rank 0 appends
the records of docs/ARCHITECTURE.md to ``--metrics-file`` and prints the
seed's human line for every logged step. The loop keeps host-device syncs to
one per optimizer step (for the timing) plus the loss read-out on logged
steps, so the measurement does not perturb what it measures.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import Any

REPO_DIR = Path(__file__).resolve().parent.parent
# The runner runs as a script under the launcher, in whatever environment the
# revision under test uses; dstui itself need not be installed there, so the
# pure-python dstui.spec.dsconfig / dstui.core.records are imported from this checkout.
if str(REPO_DIR) not in sys.path:
    sys.path.insert(0, str(REPO_DIR))

import collector  # noqa: E402

collector.pause()  # until the engine is ready (trainer.Trainer): runners/collector.py says why

import common  # noqa: E402
import process_group  # noqa: E402
import sp_check  # noqa: E402
import sp_probe  # noqa: E402
from common import RunnerError  # noqa: E402
from loop import train  # noqa: E402
from phases import PhaseClock  # noqa: E402
from train_args import build_parser, ds_config_of, settings_of  # noqa: E402
from trainer import compile_mode  # noqa: E402

from dstui.core.records import PHASES, SUMMARY, MetricsWriter  # noqa: E402

__all__ = ["main"]


def _checked(args: argparse.Namespace) -> tuple[dict[str, Any], sp_probe.Probe | None]:
    """What can be refused before any process group exists; the ds_config and the sp-check's probe."""
    s = settings_of(args)
    if args.sp_check and args.sequence_parallel < 2:
        raise RunnerError("--sp-check needs --sequence-parallel 2 or more")
    probe = sp_probe.Probe(sp_probe.parse_layers(args.sp_check_layers)) if args.sp_check else None
    if args.sequence_parallel > 1 and args.sp_mode == "ring" and (args.compile or args.deepcompile):
        raise RunnerError("--sp-mode ring runs eager: drop --compile/--deepcompile")
    if not common.is_preset(args.model) and not common.looks_like_hub_or_path(args.model):
        common.model_config(args.model)  # fails fast, before any process group exists
    return ds_config_of(args, s), probe


def main(argv: list[str] | None = None) -> int:
    clock = PhaseClock()
    args = build_parser().parse_args(argv)
    clock.live_to(args.metrics_file)  # the supervisor names each phase while it happens
    try:
        ds_config, probe = _checked(args)
    except RunnerError as e:
        print(f"train.py: error: {e}", file=sys.stderr, flush=True)
        return 2

    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    common.isolate_op_cache()
    common.skip_unused_imports()
    for lock in common.clear_stale_op_locks():
        print(
            f"train.py: removed a stale JIT-build lock left by a killed build: {lock}",
            file=sys.stderr,
            flush=True,
        )
    import deepspeed
    import torch
    import transformers  # noqa: F401 - here, not at the model build: its ~1.3 s (5 s compiled from source)
    from deepspeed.accelerator import get_accelerator

    # belong to the imports, where a user's script (benchmarks/gpu/bare_ds.py) has them too (issue 31)
    clock.mark("imports_done")
    if args.deterministic:
        torch.use_deterministic_algorithms(True)
    accel = get_accelerator()
    try:
        if accel.device_name() != "cpu":
            accel.set_device(args.local_rank)
        process_group.init_distributed()
    except Exception as e:  # noqa: BLE001 - e.g. the master port is taken
        print(f"train.py: error: cannot start the process group: {e}", file=sys.stderr, flush=True)
        return 1
    clock.mark("group_up")
    rank = deepspeed.comm.get_rank()
    if compile_mode(args, args.sequence_parallel) == "deepcompile" and accel.device_name() == "cpu":
        # Its 'dc' op includes ATen/cuda headers (deepspeed/ops/csrc/includes/deepcompile.h);
        # on a CPU-only torch the JIT build fails after minutes with "cuda.h: No such file".
        print(
            f"train.py: error: DeepCompile needs a CUDA device (DeepSpeed {deepspeed.__version__} "
            "builds its 'dc' op against CUDA headers); use --compile on CPU",
            file=sys.stderr,
            flush=True,
        )
        return 2
    writer = MetricsWriter(args.metrics_file if rank == 0 else None)
    code = 0
    try:
        losses = train(
            args, ds_config, use_sp=args.sequence_parallel > 1, writer=writer, clock=clock, probe=probe
        )
        if probe is not None:
            result = sp_check.run(args, ds_config, losses, probe)
            # the verdict goes to the metrics file too: dstui tags the run PASS/FAIL from it
            writer.write(SUMMARY, steps=args.steps, **result)
            code = 0 if result["verdict"] == "PASS" else 1
    except RunnerError as e:
        print(f"[rank {rank}] train.py: error: {e}", file=sys.stderr, flush=True)
        code = 2
    except Exception:  # noqa: BLE001 - report any failure with its traceback and a non-zero exit
        print(f"[rank {rank}] train.py: training failed:", file=sys.stderr, flush=True)
        traceback.print_exc()
        sys.stderr.flush()
        code = 1
    try:
        if code == 0:
            process_group.leave_process_group()
    finally:
        # written last, so that teardown is measured too; also after a failure (how far it got)
        clock.mark("exit")
        writer.write(PHASES, **clock.record())
        writer.close()
    return code


if __name__ == "__main__":
    process_group.exit_now(main())  # the metrics file is closed and the group left by then
