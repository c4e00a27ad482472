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
import contextlib
import copy
import math
import os
import socket
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

_RUNNERS = Path(__file__).resolve().parent
_REPO = _RUNNERS.parent
for _p in (str(_REPO), str(_RUNNERS)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

# One JIT-op cache per DeepSpeed install, shared with train.py (see common.isolate_op_cache):
# must happen before deepspeed is imported.
import common  # noqa: E402

common.isolate_op_cache()
common.skip_unused_imports()

import deepspeed  # noqa: E402
import parity_inject  # noqa: E402
import parity_tolerance  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from deepspeed.accelerator import get_accelerator  # noqa: E402
from parity import (  # noqa: E402  (needs the sys.path lines above)
    Diff,
    divergence_reason,
    scalar_diff,
    verdict_line,
    worst_tensors,
)
from parity_baseline import Baseline, make_torch_opt, mirror_zero3_hooks  # noqa: E402
from parity_engine import engine_params, engine_step, micro_batches  # noqa: E402
from parity_options import adam_spec, build_model, clipping_of, ds_config_of, dtype_of, parse_args  # noqa: E402

from dstui.core.records import HEADER, STEP, SUMMARY, MetricsWriter  # noqa: E402

# --inject lr multiplies the DeepSpeed side's learning rate by this.
LR_INJECT_FACTOR = 2.0
# --inject grad scales the DeepSpeed loss before backward at --inject-step, so
# every gradient of that step is off by 1% while the reported loss is not.
GRAD_INJECT_FACTOR = 1.01
# How many tensors the summary's ``worst`` names.
WORST_TOP = 5


# -- the run -------------------------------------------------------------------


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
    common.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    accel = get_accelerator()
    if accel.device_name() != "cpu":
        accel.set_device(int(os.environ.get("LOCAL_RANK", max(args.local_rank, 0))))
    writer = MetricsWriter(args.metrics_file if rank == 0 else None)
    try:
        return _train(args, ds_config_of(args, world), writer, fault, rank=rank, world=world)
    except BaseException as e:
        writer.write(SUMMARY, status="failed", error=f"{type(e).__name__}: {e}",
                     traceback=traceback.format_exc(limit=5))
        raise
    finally:
        writer.close()


def _train(args: argparse.Namespace, cfg: dict[str, Any], writer: MetricsWriter,
           fault: parity_inject.Fault | None, *, rank: int, world: int) -> int:
    accel = get_accelerator()
    info = common.device_info(accel)
    device = torch.device(accel.current_device_name())
    stage = int(cfg.get("zero_optimization", {}).get("stage", 0))
    dtype = dtype_of(cfg)
    micro = int(cfg.get("train_micro_batch_size_per_gpu", args.micro_batch))
    gas = int(cfg.get("gradient_accumulation_steps", 1))
    clip = clipping_of(cfg)
    opt_kind, opt_kwargs = adam_spec(cfg, args.lr)

    torch.manual_seed(args.seed)
    # Built on its device, as train.py builds (runners/placement.py): on a GPU the init comes
    # from the device's generator, so a batch's parity and training conditions start alike.
    with contextlib.nullcontext() if info["on_cpu"] else device:
        model, model_cfg = build_model(args.model)
    # The baselines are copies of the initial weights taken before DeepSpeed
    # partitions, casts or moves anything.
    baselines = []
    for coarse in (False, True):
        copy_ = copy.deepcopy(model).to(device)
        if args.mirror_zero3_hooks:
            mirror_zero3_hooks(copy_)
        if args.compile:
            copy_ = torch.compile(copy_)
        baselines.append(Baseline(copy_, dtype=dtype, opt_kind=opt_kind, opt_kwargs=opt_kwargs, clip=clip,
                                  reduce="micro" if stage >= 2 else "boundary", coarse=coarse))
    ds_cfg = copy.deepcopy(cfg)
    ds_kwargs = dict(opt_kwargs)
    if args.inject == "lr":
        ds_kwargs["lr"] = opt_kwargs["lr"] * LR_INJECT_FACTOR
        if ds_cfg.get("optimizer"):
            ds_cfg["optimizer"].setdefault("params", {})["lr"] = ds_kwargs["lr"]
    client_opt = None if ds_cfg.get("optimizer") else make_torch_opt(model.parameters(), opt_kind, ds_kwargs)
    n_params = sum(p.numel() for p in model.parameters())
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           optimizer=client_opt, config=ds_cfg)
    if fault is not None:
        parity_inject.install(engine, fault)
    if args.compile:
        engine.compile()

    exact_ok, why = parity_tolerance.exact_is_possible(
        dtype=dtype, world=world, clip=clip, client_optimizer=client_opt is not None, stage=stage,
        mirror_zero3_hooks=args.mirror_zero3_hooks)
    policy = parity_tolerance.choose(args.tolerance, rtol=args.rtol, atol=args.atol,
                                     can_be_exact=exact_ok, why=why, dtype=dtype)
    measured = policy.mode == "measured"
    if not measured:
        baselines = baselines[:1]  # the twin only measures noise
    base, twin = baselines[0], (baselines[1] if measured else None)
    tokens_per_step = micro * world * gas * args.seq_length
    ds_named = list(engine.module.named_parameters())

    if rank == 0:
        writer.write(
            HEADER, runner="compare_loss",
            config={**vars(args), "world_size": world, "zero_stage": stage, "dtype": dtype,
                    "grad_accum": gas},
            ds_config=cfg, versions=common.versions(), deepspeed_git_sha=common.deepspeed_git_sha(),
            device=info["device"], gpu_name=info["gpu_name"], gpu_count=info["gpu_count"],
            world_size=world, hostname=socket.gethostname(), tokens_per_step=tokens_per_step,
            params=n_params, flops_per_token=6 * n_params, peak_tflops=None,
            baseline_optimizer={"type": opt_kind, **opt_kwargs}, gradient_clipping=clip,
            tolerance_mode=policy.mode, inject=fault.kind if fault else args.inject,
        )
        print(f"compare_loss: ZeRO-{stage} {dtype} world={world} grad_accum={gas} clip={clip:g} "
              f"model={args.model} optimizer={'client ' if client_opt is not None else ''}{opt_kind} "
              f"tolerance={policy.mode}{' (' + why + ')' if why else ''} "
              f"inject={fault.kind if fault else args.inject}", flush=True)

    first_step: int | None = None
    first_reason = ""
    first_worst: list[dict] = []
    overall: dict[tuple[str, str], float] = {}
    iter_times: list[float] = []
    maxima = dict.fromkeys(("loss_abs_diff", "grad_max_abs_diff", "grad_max_rel_diff",
                            "param_max_abs_diff", "param_max_rel_diff"), 0.0)
    mem_peak_max = 0
    final_loss = math.nan

    for step in range(1, args.steps + 1):
        xs = micro_batches(args, step, rank=rank, world=world, micro=micro, gas=gas,
                           vocab=int(model_cfg.vocab_size), device=device)
        grad_scale = GRAD_INJECT_FACTOR if args.inject == "grad" and step == args.inject_step else 1.0
        common_sync(accel)
        t0 = time.perf_counter()
        loss_v, ds_grads, scale, skipped = engine_step(engine, xs, ds_named, stage=stage, dtype=dtype,
                                                       grad_scale=grad_scale)
        common_sync(accel)
        iter_time = time.perf_counter() - t0
        ds_params = engine_params(ds_named, stage)
        base_v, base_grads, base_norm = base.step(xs, loss_scale=scale, skip=skipped)
        base_params = base.params()
        if twin is not None:
            twin_v, twin_grads, _ = twin.step(xs, loss_scale=scale, skip=skipped)
            twin_params = twin.params()
            policy.noise.observe("loss", [(torch.tensor(twin_v), torch.tensor(base_v))])
            policy.noise.observe("grad", [(twin_grads[n], g) for n, g in base_grads.items()])
            policy.noise.observe("param", [(twin_params[n], p) for n, p in base_params.items()])

        missing = set(ds_grads) ^ set(base_grads)
        if missing:
            raise RuntimeError(f"gradients present on one side only: {sorted(missing)[:5]}")
        rtol = policy.rtol_for()
        loss_d, loss_ok = scalar_diff(loss_v, base_v, rtol, policy.atol_for("loss", torch.tensor(base_v)))
        diffs = {"grad": Diff(), "param": Diff()}
        for n, g in ds_grads.items():
            diffs["grad"].add(n, g, base_grads[n], rtol, policy.atol_for("grad", base_grads[n]))
        for n, p in ds_params.items():
            diffs["param"].add(n, p, base_params[n], rtol, policy.atol_for("param", base_params[n]))
        gdiff, pdiff = diffs["grad"], diffs["param"]

        # Every rank checked its own micro-batches; combine: means of losses, maxima of diffs.
        sums = torch.tensor([loss_v, base_v], dtype=torch.float64, device=device)
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        worst = torch.tensor([loss_d, gdiff.max_abs, gdiff.max_rel, pdiff.max_abs, pdiff.max_rel,
                              float(not loss_ok), float(not gdiff.ok), float(not pdiff.ok)],
                             dtype=torch.float64, device=device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        w = worst.tolist()
        mem_alloc, mem_peak = common.memory(accel, info["on_cpu"])
        mem_peak_max = max(mem_peak_max, mem_peak)
        within = not any(w[5:])
        final_loss = sums[0].item() / world
        grad_norm = engine.get_global_grad_norm()
        rec: dict[str, Any] = {
            "step": step, "epoch": 1, "loss": final_loss, "loss_baseline": sums[1].item() / world,
            "loss_diff": (sums[0].item() - sums[1].item()) / world, "loss_abs_diff": w[0],
            "grad_max_abs_diff": w[1], "grad_max_rel_diff": w[2],
            "param_max_abs_diff": w[3], "param_max_rel_diff": w[4],
            "loss_within_tol": int(not w[5]), "grad_within_tol": int(not w[6]),
            "param_within_tol": int(not w[7]), "within_tol": int(within),
            "grad_norm": float(grad_norm) if grad_norm is not None else None,
            "grad_norm_baseline": base_norm, "skipped": int(skipped),
            "iter_time": iter_time, "tokens_per_s": tokens_per_step / iter_time if iter_time > 0 else 0.0,
            "mem_alloc": mem_alloc, "mem_peak": mem_peak, "lr": float(engine.get_lr()[0]),
        }
        if measured:
            rec.update({f"noise_{k}_rel": v for k, v in policy.noise.rel.items()})
        iter_times.append(iter_time)
        for k in maxima:
            maxima[k] = max(maxima[k], rec[k])
        for kind, d in diffs.items():
            for name, m in d.per_tensor:
                overall[(kind, name)] = max(overall.get((kind, name), 0.0), m)
        if not within and first_step is None:
            first_step = step
            first_worst = worst_tensors(diffs, WORST_TOP, offenders_only=True)
            first_reason = divergence_reason(rec, rtol, policy.tolerance(), [
                gdiff.worst if not gdiff.ok else "", pdiff.worst if not pdiff.ok else ""])
            if rank == 0:
                for what, d in diffs.items():
                    for name, dmax, bad, n in sorted(d.offenders, key=lambda o: -o[1])[:24]:
                        print(f"  {what} {name}: max|d| {dmax:.3e}, {bad}/{n} elements out of tolerance",
                              flush=True)
        if rank == 0:
            writer.write(STEP, **{k: v for k, v in rec.items() if v is not None})
            print(f"step {step}/{args.steps} loss {rec['loss']:.6f} baseline {rec['loss_baseline']:.6f} "
                  f"|dloss| {rec['loss_abs_diff']:.3e} grad |d| {rec['grad_max_abs_diff']:.3e} "
                  f"param |d| {rec['param_max_abs_diff']:.3e} norm {rec['grad_norm']} vs {base_norm:.6g} "
                  f"{'ok' if within else 'DIVERGED'}", flush=True)
            print(f"Epoch 1, Step {step}, Loss: {rec['loss']:.6f} sync: True time: {iter_time:.6f} "
                  f"alloc_mem: {mem_alloc} peak_mem: {mem_peak}", flush=True)

    verdict = "PASS" if first_step is None else "FAIL"
    if rank == 0:
        top = sorted(overall.items(), key=lambda kv: -kv[1])[:WORST_TOP]
        mean_time = statistics.fmean(iter_times)
        writer.write(
            SUMMARY, steps=args.steps, warmup_steps=0,
            iter_time_mean=mean_time, iter_time_std=statistics.pstdev(iter_times),
            # total tokens / total time, as train.py's summary and the report (not a mean of per-step rates)
            tokens_per_s_mean=tokens_per_step / mean_time if mean_time > 0 else 0.0,
            compile_time=iter_times[0] if args.compile else 0.0, mem_peak_max=mem_peak_max,
            final_loss=final_loss, verdict=verdict, first_diverging_step=first_step,
            reason=first_reason or None,
            worst=first_worst if first_step else [
                {"name": n, "kind": k, "max_abs_diff": v} for (k, n), v in top if v > 0],
            tolerance=policy.tolerance(), tolerance_basis=policy.basis(), tolerance_mode=policy.mode,
            rtol=policy.rtol_for(), atol=policy.atol if policy.mode == "given" else 0.0,
            **{f"{k}_max": v for k, v in maxima.items()}, status="ok",
        )
        print(f"tolerance: {policy.basis()}", flush=True)
        print(verdict_line(first_step, first_reason), flush=True)
    return 0 if verdict == "PASS" else 1


def common_sync(accel: Any) -> None:
    """Wait for the device so that step times are real (a no-op on CPU)."""
    if accel.device_name() != "cpu":
        accel.synchronize()


def main(argv: list[str] | None = None) -> int:
    """Exit code: 0 PASS, 1 FAIL, 2 error.

    On an error the process leaves with ``os._exit``: a normal exit would run
    the process group's destructor, which blocks while the other rank waits in
    a collective, and the launcher would never see this rank die (the job
    hangs instead of failing). After ``_exit`` the launcher kills the peers.
    A ``SystemExit("compare_loss.py: error: ...")`` is a refusal: its one line is printed
    as the last error line (dstui's failure reason) and the exit code is 2.
    """
    args = parse_args(argv)
    try:
        code = run(args)
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr, flush=True)
        common.exit_now(2 if e.code not in (0, None) else 0)
    except Exception:
        traceback.print_exc()
        common.exit_now(2)
    # Both ranks got here: leave the process group together, then skip the interpreter's
    # teardown (common.exit_now says why).
    try:
        if deepspeed.comm.is_initialized():
            common.leave_process_group()
    except Exception:  # noqa: BLE001 - the verdict is already written
        pass
    common.exit_now(code)


if __name__ == "__main__":
    sys.exit(main())
