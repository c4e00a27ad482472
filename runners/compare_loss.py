"""ZeRO vs plain PyTorch parity: loss, gradients and parameters, step by step.

Started by the DeepSpeed launcher (seed 002)::

    python -m deepspeed.launcher.runner --num_gpus 2 --master_port P \\
        runners/compare_loss.py --zero-stage 3 --torch-adam --dtype fp32 --steps 5

Every rank builds the same tiny model from the same seed, deep-copies it as the
baseline *before* DeepSpeed touches it, and then trains both on the same
synthetic tokens: DeepSpeed (ZeRO stage 0-3, offload, compile, ...) on one
side, a plain ``torch.nn.Module`` with ``torch.optim.AdamW`` (AMP autocast for
bf16/fp16) on the other. After each step the per-step loss, the full (gathered)
gradients before the update and the full parameters after it are compared with
``torch.allclose`` semantics; ``rtol = atol = 0`` demands bit equality.

How the baseline reproduces data parallelism, and why that can be bit-exact:
each rank runs the baseline on *its own* micro-batch and all-reduces the
baseline's gradients (SUM, then divide by the world size), exactly what DDP and
DeepSpeed do. Running the whole global batch through one baseline forward
instead would sum the per-sample contributions inside one matmul, in a
different order than "per-rank gradient, then cross-rank sum", and fp32 results
would differ in the last bits for reasons that have nothing to do with ZeRO.
With two ranks the cross-rank reduction is a single addition ``a + b``, which is
commutative, and dividing by 2 (or pre-dividing each side by 2) is exact in
binary floating point, so every placement of the averaging that DeepSpeed may
choose gives the same bits. With more ranks the summation order of the ring
all-reduce depends on bucket layout and chunking, so expect last-bit
differences there and use a tolerance.

Recipes beyond that one (gradient accumulation, bf16/fp16 with fp32 masters,
clipping, many buckets, overlapped communication, 3+ ranks): the baseline is
written out in runners/parity_baseline.py, and runners/parity_tolerance.py
decides whether a run must be bit-exact or gets a tolerance measured from a
twin baseline's noise. Faults can be injected into the engine through
``$DSTUI_PARITY_INJECT`` (runners/parity_inject.py).

A matrix of recipes can share one launch: ``--cases FILE`` runs several parity runs
in the same ranks, each with its own argv, environment, metrics file, log and exit
code (runners/parity_cases.py); on these tiny models that spends a few CPU-seconds
a case instead of a rank start-up's ~12.

ZeRO-3 and exactness: ZeRO-3 wraps the inputs and outputs of every module in
identity autograd Functions (its backward hooks). They change no values but
regroup how autograd sums the gradient of a tensor used three or more times
(the residual stream of a transformer), so against a plain baseline ZeRO-3
gradients differ by a few ulp from step 1. ``--mirror-zero3-hooks`` wraps the
baseline the same way; then ZeRO-3 matches bit for bit, which shows that its
partitioning and collectives are exact (tests/test_compare_loss.py).

Output: metrics records (``header``/``step``/``summary``, docs/ARCHITECTURE.md)
from rank 0, a readable line per step, the seed's ``Epoch 1, Step N, Loss:``
line, and a final ``PASS`` or ``FAIL (first diverging step N: ...)``; the exit
code is 0 on PASS and 1 on FAIL on every rank.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import traceback
from pathlib import Path

_RUNNERS = Path(__file__).resolve().parent
_REPO = _RUNNERS.parent
for _p in (str(_REPO), str(_RUNNERS)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

# One JIT-op cache per DeepSpeed install, shared with train.py (see common.isolate_op_cache):
# must happen before deepspeed is imported.
import collector  # noqa: E402

collector.pause()  # until both sides are built (parity_session.ParitySession.run): runners/collector.py

import common  # noqa: E402

common.isolate_op_cache()
common.skip_unused_imports()

import deepspeed  # noqa: E402
import parity_cases  # noqa: E402
import parity_inject  # noqa: E402
import process_group  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from deepspeed.accelerator import get_accelerator  # noqa: E402
from parity_options import ds_config_of, parse_args  # noqa: E402
from parity_pipeline import PipelineParitySession  # noqa: E402
from parity_session import ParitySession  # noqa: E402

from dstui.core.records import SUMMARY, MetricsWriter  # noqa: E402


def run(args: argparse.Namespace) -> int:
    """Train both sides for ``args.steps`` steps; return the exit code (0 PASS, 1 FAIL)."""
    if args.verbose_logging:
        torch._logging.set_logs(recompiles=True, guards=True, graph_breaks=True)
    try:
        fault = parity_inject.from_env()  # a bad value fails before any process group exists
    except ValueError as e:
        raise SystemExit(f"compare_loss.py: error: {e}") from None
    if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" not in os.environ:
        # Started without a launcher: one rank, instead of DeepSpeed's MPI discovery.
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    process_group.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    accel = get_accelerator()
    if accel.device_name() != "cpu":
        accel.set_device(int(os.environ.get("LOCAL_RANK", max(args.local_rank, 0))))
    writer = MetricsWriter(args.metrics_file if rank == 0 else None)
    try:
        session = PipelineParitySession if args.pipeline_stages > 1 else ParitySession
        return session(args, ds_config_of(args, world), writer, fault, rank=rank, world=world).run()
    except BaseException as e:
        writer.write(SUMMARY, status="failed", error=f"{type(e).__name__}: {e}",
                     traceback=traceback.format_exc(limit=5))
        raise
    finally:
        writer.close()


def run_cases(launch: argparse.Namespace) -> int:
    """``--cases``: each case run as a launch of its own would run it (runners/parity_cases.py)."""
    cases = parity_cases.load(launch.cases)
    parity_cases.refuse_mixed_topologies([parse_args(c.argv).pipeline_stages for c in cases])
    # what the launcher gave this process, as it would give it to each case's own launch
    given = [f"--local_rank={launch.local_rank}"] if launch.local_rank >= 0 else []
    return parity_cases.run_all(cases, lambda argv: run(parse_args([*argv, *given])),
                                rank=lambda: dist.get_rank() if dist.is_initialized() else 0, barrier=dist.barrier,
                                cleared=(parity_inject.ENV, "DSTUI_METRICS_FILE"), on_error=process_group.exit_now)


def main(argv: list[str] | None = None) -> int:
    """Exit code: 0 PASS, 1 FAIL, 2 error (with ``--cases``: 0 once every case ran, each case's code in its
    exit file, 2 as soon as one errs).

    On an error the process leaves with ``os._exit``: a normal exit would run
    the process group's destructor, which blocks while the other rank waits in
    a collective, and the launcher would never see this rank die (the job
    hangs instead of failing). After ``_exit`` the launcher kills the peers.
    A ``SystemExit("compare_loss.py: error: ...")`` is a refusal: its one line is printed
    as the last error line (dstui's failure reason) and the exit code is 2.
    """
    args = parse_args(argv)
    try:
        code = run_cases(args) if args.cases else run(args)
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr, flush=True)
        process_group.exit_now(2 if e.code not in (0, None) else 0)
    except Exception:
        traceback.print_exc()
        process_group.exit_now(2)
    # Both ranks got here: leave the process group together, then skip the interpreter's
    # teardown (process_group.exit_now says why).
    try:
        if deepspeed.comm.is_initialized():
            process_group.leave_process_group()
    except Exception:  # noqa: BLE001 - the verdict is already written
        pass
    process_group.exit_now(code)


if __name__ == "__main__":
    sys.exit(main())
