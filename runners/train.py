#!/usr/bin/env python
"""dstui's bundled training runner: one DeepSpeed job, measured the same way every time.

Started by DeepSpeed's launcher (one process per rank)::

    python -m deepspeed.launcher.runner --num_gpus 2 --master_port 29500 \\
        runners/train.py --model tiny-llama --zero-stage 3 --steps 10

Its arguments are the dash-form of the dstui ``Settings`` fields
(dstui/spec.py), so a RunSpec maps onto an argv one to one. Rank 0 appends
the records of docs/ARCHITECTURE.md to ``--metrics-file`` and prints the
seed's human line for every logged step. The loop keeps host-device syncs to
one per optimizer step (for the timing) plus the loss read-out on logged
steps, so the measurement does not perturb what it measures.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO_DIR = Path(__file__).resolve().parent.parent
# The runner runs as a script under the launcher, in whatever environment the
# revision under test uses; dstui itself need not be installed there, so the
# pure-python dstui.spec.dsconfig / dstui.core.records are imported from this checkout.
if str(REPO_DIR) not in sys.path:
    sys.path.insert(0, str(REPO_DIR))

import common  # noqa: E402
from common import RunnerError  # noqa: E402

from dstui.core.records import HEADER, STEP, SUMMARY, MetricsWriter, seed_line  # noqa: E402
from dstui.spec import dsconfig  # noqa: E402
from dstui.spec.models import Settings  # noqa: E402

_D = Settings.model_fields


def _default(name: str) -> Any:
    return _D[name].default


def build_parser() -> argparse.ArgumentParser:
    """Flags named after the Settings fields; defaults come from Settings so the two never drift."""
    p = argparse.ArgumentParser(
        prog="runners/train.py",
        description=(
            "Train a causal LM with DeepSpeed for a fixed number of optimizer steps and "
            "record loss, iteration time, throughput and memory (dstui's bundled runner). "
            "Start it with the DeepSpeed launcher, e.g. `deepspeed --num_gpus 2 runners/train.py ...`."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    a = p.add_argument
    a(
        "--model",
        default=_default("model"),
        help=f"model preset in configs/models/ ({', '.join(common.presets())}), a hub id or a local path; "
        "presets are random-initialised from their config",
    )
    a(
        "--load-weights",
        action="store_true",
        help="load pretrained weights of a hub/local model (default: its config only, random init)",
    )
    a(
        "--dataset",
        default=_default("dataset"),
        help="'tiny-corpus' (shipped text, byte tokens), 'synthetic' (seeded random tokens) "
        "or a Hugging Face dataset name (needs the hub or its cache)",
    )
    a(
        "--dataset-config",
        default=_default("dataset_config"),
        help="HF dataset config name, e.g. wikitext-2-raw-v1",
    )
    a(
        "--dataset-percent",
        type=float,
        default=_default("dataset_percent"),
        help="percentage of the train split (or of tiny-corpus) to use",
    )
    a("--seq-length", type=int, default=_default("seq_length"), help="tokens per sample")
    a(
        "--micro-batch",
        type=int,
        default=_default("micro_batch"),
        help="samples per rank per micro step (train_micro_batch_size_per_gpu)",
    )
    a(
        "--grad-accum",
        type=int,
        default=_default("grad_accum"),
        help="micro steps per optimizer step (gradient_accumulation_steps)",
    )
    a("--steps", type=int, default=_default("steps"), help="optimizer steps to run")
    a(
        "--warmup-steps",
        type=int,
        default=_default("warmup_steps"),
        help="leading steps left out of the timing statistics of the summary",
    )
    a(
        "--log-interval",
        type=int,
        default=_default("log_interval"),
        help="write a step record every N optimizer steps (the last step is always logged)",
    )
    a(
        "--dtype",
        choices=["fp32", "bf16", "fp16"],
        default=_default("dtype"),
        help="training precision",
    )
    a("--zero-stage", type=int, default=_default("zero_stage"), help="ZeRO stage 0-3")
    a(
        "--offload",
        choices=["none", "cpu", "nvme"],
        default=_default("offload"),
        help="offload optimizer state (ZeRO >= 1; cpu needs DeepSpeedCPUAdam, JIT-built)",
    )
    a(
        "--offload-params",
        choices=["none", "cpu", "nvme"],
        default=_default("offload_params"),
        help="offload parameters (ZeRO-3 only)",
    )
    a("--nvme-path", default=_default("nvme_path"), help="swap folder for nvme offload")
    a(
        "--deepcompile",
        action="store_true",
        help="DeepSpeed DeepCompile: compile.deepcompile=true and engine.compile()",
    )
    a("--compile", action="store_true", help="torch.compile the engine (engine.compile())")
    a(
        "--activation-checkpointing",
        action="store_true",
        help="HF gradient checkpointing (recompute activations in backward)",
    )
    a(
        "--sequence-parallel",
        type=int,
        default=_default("sequence_parallel"),
        help="Ulysses sequence-parallel degree (ranks that share one sequence); 1 = off",
    )
    a(
        "--sp-mode",
        choices=["eager", "compile", "deepcompile"],
        default=_default("sp_mode"),
        help="how the Ulysses model runs: eager, torch.compile, or DeepCompile",
    )
    a(
        "--sp-check",
        action="store_true",
        help="after the sequence-parallel run, train the same steps on the same samples without "
        "sequence parallelism and compare the losses (exit 1 when they differ beyond "
        "--sp-rtol/--sp-atol)",
    )
    a("--sp-rtol", type=float, default=1e-4, help="relative tolerance of --sp-check")
    a("--sp-atol", type=float, default=1e-5, help="absolute tolerance of --sp-check")
    a("--lr", type=float, default=_default("lr"), help="AdamW learning rate (constant)")
    a(
        "--torch-adam",
        action="store_true",
        help="use torch.optim.AdamW as a client optimizer instead of DeepSpeed's AdamW",
    )
    a("--seed", type=int, default=_default("seed"), help="seed of init, data order and dropout")
    a(
        "--deterministic",
        action="store_true",
        help="torch.use_deterministic_algorithms(True) (slower; sets CUBLAS_WORKSPACE_CONFIG)",
    )
    a(
        "--ds-config",
        default=None,
        help="DeepSpeed config JSON to use as-is (dstui writes one per run); without it the "
        "runner builds one from these flags over configs/deepspeed/base.json",
    )
    a(
        "--metrics-file",
        default=os.environ.get("DSTUI_METRICS_FILE"),
        help="file rank 0 appends the JSON records to (default: $DSTUI_METRICS_FILE; unset = none)",
    )
    a(
        "--local_rank",
        "--local-rank",
        dest="local_rank",
        type=int,
        default=int(os.environ.get("LOCAL_RANK", 0)),
        help="set by the launcher",
    )
    return p


def settings_of(args: argparse.Namespace) -> Settings:
    """The args as a validated Settings, so the runner refuses what dstui itself would refuse."""
    from pydantic import ValidationError

    # --ds-config is a path to a finished config, not Settings.ds_config (a template name).
    fields = {k: v for k, v in vars(args).items() if k in _D and k != "ds_config"}
    try:
        return Settings(**fields)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err.get("loc", ()))
        flag = f"--{where.replace('_', '-')}: " if where else ""
        msg = str(err["msg"]).removeprefix(
            "Value error, "
        )  # pydantic's prefix says nothing to a user
        raise RunnerError(f"{flag}{msg}") from None


def ds_config_of(args: argparse.Namespace, s: Settings) -> dict[str, Any]:
    """The given config as-is, or one generated by dstui.spec.dsconfig (standalone use)."""
    if args.ds_config:
        path = Path(args.ds_config)
        if not path.is_file():
            raise RunnerError(f"--ds-config: no such file: {path}")
        import json

        try:
            cfg = json.loads(path.read_text())
        except ValueError as e:
            raise RunnerError(f"--ds-config {path}: invalid JSON: {e}") from None
        if not isinstance(cfg, dict):
            raise RunnerError(f"--ds-config {path}: not a JSON object")
        return cfg
    return dsconfig.deep_merge(dsconfig.load_template("base.json"), dsconfig.from_settings(s))


class Trainer:
    """One DeepSpeed engine plus the data it eats and the numbers it produces."""

    def __init__(
        self, args: argparse.Namespace, ds_config: dict[str, Any], *, use_sp: bool
    ) -> None:
        import deepspeed
        import torch
        import transformers
        from deepspeed.accelerator import get_accelerator

        self.args = args
        self.accel = get_accelerator()
        self.dev = common.device_info(self.accel)
        self.rank = deepspeed.comm.get_rank()
        self.world = deepspeed.comm.get_world_size()
        self.sp = args.sequence_parallel if use_sp else 1
        if self.world % self.sp:
            raise RunnerError(
                f"--sequence-parallel {self.sp} does not divide the {self.world} ranks"
            )
        self.dp = self.world // self.sp

        transformers.set_seed(args.seed)
        config = common.model_config(args.model)
        self.layers, self.hidden, heads, kv_heads, self.vocab = common.arch(config)
        if hasattr(config, "use_cache"):
            config.use_cache = False  # a KV cache is useless in training and costs memory
        mpu = None
        if self.sp > 1:
            import ulysses

            mpu = ulysses.register(args, config, heads, kv_heads)
        model = common.build_model(
            args.model, config, load_weights=args.load_weights, attn_implementation="sdpa"
        )
        if args.activation_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        self.params = common.count_params(model)

        cfg = dict(ds_config)
        if args.deepcompile or (self.sp > 1 and args.sp_mode == "deepcompile"):
            cfg = dsconfig.deep_merge(cfg, {"compile": {"deepcompile": True}})
        if self.sp > 1:
            cfg["sequence_parallel_size"] = self.sp
        else:
            cfg.pop("sequence_parallel_size", None)
        self.ds_config = cfg

        init: dict[str, Any] = {"model": model, "config": cfg}
        if args.torch_adam or "optimizer" not in cfg:
            init["optimizer"] = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        else:
            init["model_parameters"] = [p for p in model.parameters() if p.requires_grad]
        if mpu is not None:
            init["mpu"] = mpu
        self.engine, *_ = deepspeed.initialize(**init)
        if (
            args.compile
            or args.deepcompile
            or (self.sp > 1 and args.sp_mode in ("compile", "deepcompile"))
        ):
            self.engine.compile()

        self.micro_batch = self.engine.train_micro_batch_size_per_gpu()
        self.grad_accum = self.engine.gradient_accumulation_steps()
        self.tokens_per_step = self.micro_batch * self.grad_accum * args.seq_length * self.dp
        self.flops_per_token = common.flops_per_token(
            self.params, self.layers, self.hidden, args.seq_length
        )
        self.peak = common.peak_tflops(self.dev["gpu_name"], args.dtype)
        self.device = self.accel.current_device_name()
        self.batches = self._data()

    def _data(self) -> Any:
        """This rank's batch iterator. Every rank draws its own shard of the packed blocks."""
        a = self.args
        # Enough blocks for the run (synthetic data is generated to size; text wraps into epochs).
        needed = a.steps * self.grad_accum * self.micro_batch * self.world
        tokens, self.data_source = common.load_tokens(
            a.dataset,
            dataset_config=a.dataset_config,
            percent=a.dataset_percent,
            model_name=a.model,
            vocab=self.vocab,
            seq_length=a.seq_length,
            samples_needed=needed,
            seed=a.seed,
        )
        if int(tokens.max()) >= self.vocab:
            raise RunnerError(
                f"the data has token ids up to {int(tokens.max())}, beyond the vocabulary ({self.vocab})"
            )
        blocks = common.pack(tokens, a.seq_length)
        self.shard = common.ShardedBatches(blocks, self.micro_batch, self.world, self.rank, a.seed)
        if self.sp > 1:
            import ulysses

            return ulysses.data(self.shard, self.accel)
        return iter(self.shard)

    def loss_of(self, batch: dict[str, Any]) -> Any:
        if self.sp > 1:
            import ulysses

            return ulysses.loss(self.engine, batch)
        return self.engine(**batch).loss

    def step(self) -> tuple[float, Any]:
        """One optimizer step: (wall time after a device synchronize, summed micro-step loss tensor)."""
        import torch

        t0 = time.perf_counter()
        total = torch.zeros((), dtype=torch.float32, device=self.device)
        for _ in range(self.grad_accum):
            batch = {k: v.to(self.device, non_blocking=True) for k, v in next(self.batches).items()}
            loss = self.loss_of(batch)
            self.engine.backward(loss)
            self.engine.step()
            total += loss.detach().float()  # stays on the device: no sync here
        self.accel.synchronize()
        return time.perf_counter() - t0, total

    def global_loss(self, total: Any) -> float:
        """Mean over the micro steps and over the data-parallel ranks, so every ZeRO stage logs the same number.

        Gloo has no AVG reduction, hence SUM / world. Ranks of one
        sequence-parallel group already hold the same (gathered) loss, so the
        mean over all ranks equals the mean over the data-parallel groups.
        """
        import deepspeed

        t = total / self.grad_accum
        deepspeed.comm.all_reduce(t, op=deepspeed.comm.ReduceOp.SUM)
        return float(t.item()) / self.world

    def tflops_per_gpu(self, iter_time: float) -> float:
        """Model TFLOP/s per rank (GPU) for one optimizer step of ``iter_time`` seconds."""
        return self.flops_per_token * self.tokens_per_step / iter_time / self.world / 1e12

    def memory(self) -> tuple[int, int]:
        return common.memory(self.accel, self.dev["on_cpu"])

    def lr(self) -> float | None:
        try:
            return float(self.engine.get_lr()[0])
        except (AttributeError, IndexError, TypeError):
            return None

    def epoch(self) -> int:
        return self.shard.epoch + 1  # 1-based, as in the seed's "Epoch 1, Step ..." line


def train(
    args: argparse.Namespace,
    ds_config: dict[str, Any],
    *,
    use_sp: bool,
    writer: MetricsWriter | None,
) -> list[float]:
    """Run ``args.steps`` optimizer steps; return the logged losses. ``writer`` None = a silent check run."""
    tr = Trainer(args, ds_config, use_sp=use_sp)
    rank0 = tr.rank == 0
    if writer is not None:
        writer.write(
            HEADER,
            config=vars(args),
            ds_config=tr.ds_config,
            versions=common.versions(),
            deepspeed_git_sha=common.deepspeed_git_sha(),
            device=tr.dev["device"],
            gpu_name=tr.dev["gpu_name"],
            gpu_count=tr.dev["gpu_count"],
            world_size=tr.world,
            hostname=common.hostname(),
            tokens_per_step=tr.tokens_per_step,
            params=tr.params,
            flops_per_token=tr.flops_per_token,
            peak_tflops=tr.peak,
            data=tr.data_source,
            sequence_parallel=tr.sp,
            dp_world_size=tr.dp,
        )

    times: list[float] = []
    losses: list[float] = []
    mem_peak_max = 0
    for step in range(1, args.steps + 1):
        dt, total = tr.step()
        times.append(dt)
        if step % args.log_interval and step != args.steps:
            continue
        loss = tr.global_loss(total)  # the only extra sync: on logged steps
        losses.append(loss)
        if writer is None:
            continue
        alloc, peak = tr.memory()
        mem_peak_max = max(mem_peak_max, peak)
        rec: dict[str, Any] = {
            "step": step,
            "epoch": tr.epoch(),
            "loss": loss,
            "iter_time": dt,
            "tokens_per_s": tr.tokens_per_step / dt,
        }
        rec["tflops_per_gpu"] = tr.tflops_per_gpu(dt)
        if tr.peak:
            rec["mfu"] = rec["tflops_per_gpu"] / tr.peak
        rec.update(mem_alloc=alloc, mem_peak=peak, lr=tr.lr())
        writer.write(STEP, **rec)
        if rank0:
            print(seed_line(rec["epoch"], step, loss, dt, alloc, peak), flush=True)

    if writer is not None:
        # Statistics over every step after warm-up, logged or not: the timing
        # sync happens on every step, so unlogged steps are measured too.
        timed = times[args.warmup_steps :] or times
        later = times[1:]
        tflops = [tr.tflops_per_gpu(t) for t in timed]
        summary: dict[str, Any] = {
            "steps": args.steps,
            "warmup_steps": args.warmup_steps,
            "iter_time_mean": statistics.fmean(timed),
            "iter_time_std": statistics.stdev(timed) if len(timed) > 1 else 0.0,
            "tokens_per_s_mean": statistics.fmean(tr.tokens_per_step / t for t in timed),
            "tflops_per_gpu_mean": statistics.fmean(tflops),
            # The first step pays for compilation, autotuning and allocator warm-up.
            "compile_time": max(0.0, times[0] - statistics.median(later)) if later else 0.0,
            "mem_peak_max": max(mem_peak_max, tr.memory()[1]),
            "final_loss": losses[-1] if losses else None,
            "status": "ok",
        }
        if tr.peak:
            summary["mfu_mean"] = statistics.fmean(tflops) / tr.peak
        writer.write(SUMMARY, **summary)
    destroy = getattr(tr.engine, "destroy", None)
    if destroy is not None:  # frees ZeRO hooks/buffers before a second engine (--sp-check)
        destroy()
    return losses


def sp_check(args: argparse.Namespace, ds_config: dict[str, Any], sp_losses: list[float]) -> bool:
    """Train again without sequence parallelism on the same samples and compare the logged losses."""
    import deepspeed
    import ulysses

    ref_args = argparse.Namespace(**vars(args))
    ulysses.reset()
    ref_losses = train_reference(ref_args, ds_config)
    ok = len(ref_losses) == len(sp_losses)
    lines = []
    for i, (a, b) in enumerate(zip(sp_losses, ref_losses, strict=False)):
        close = math.isclose(a, b, rel_tol=args.sp_rtol, abs_tol=args.sp_atol)
        ok = ok and close
        lines.append(
            f"  logged step {i + 1}: sp {a:.6f}  no-sp {b:.6f}  diff {a - b:+.3e}  {'ok' if close else 'DIFF'}"
        )
    if deepspeed.comm.get_rank() == 0:
        verdict = "match" if ok else "DIFFER"
        print(f"sp-check: losses {verdict} (rtol {args.sp_rtol}, atol {args.sp_atol})", flush=True)
        print("\n".join(lines), flush=True)
    return ok


def train_reference(args: argparse.Namespace, ds_config: dict[str, Any]) -> list[float]:
    """The no-SP twin of an SP run: each rank trains on the full micro batches its SP group saw."""
    import ulysses

    tr = Trainer(args, ds_config, use_sp=False)
    tr.batches = ulysses.reference_batches(tr.shard, args.sequence_parallel, tr.rank, tr.world)
    losses = []
    for step in range(1, args.steps + 1):
        _, total = tr.step()
        if step % args.log_interval == 0 or step == args.steps:
            losses.append(tr.global_loss(total))
    return losses


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        s = settings_of(args)
        if args.sp_check and args.sequence_parallel < 2:
            raise RunnerError("--sp-check needs --sequence-parallel 2 or more")
        if not common.is_preset(args.model) and not common.looks_like_hub_or_path(args.model):
            common.model_config(args.model)  # fails fast, before any process group exists
        ds_config = ds_config_of(args, s)
    except RunnerError as e:
        print(f"train.py: error: {e}", file=sys.stderr, flush=True)
        return 2

    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    common.isolate_op_cache()
    for lock in common.clear_stale_op_locks():
        print(
            f"train.py: removed a stale JIT-build lock left by a killed build: {lock}",
            file=sys.stderr,
            flush=True,
        )
    import deepspeed
    import torch
    from deepspeed.accelerator import get_accelerator

    if args.deterministic:
        torch.use_deterministic_algorithms(True)
    accel = get_accelerator()
    try:
        if accel.device_name() != "cpu":
            accel.set_device(args.local_rank)
        deepspeed.init_distributed()
    except Exception as e:  # noqa: BLE001 - e.g. the master port is taken
        print(f"train.py: error: cannot start the process group: {e}", file=sys.stderr, flush=True)
        return 1
    rank = deepspeed.comm.get_rank()
    wants_dc = args.deepcompile or (args.sequence_parallel > 1 and args.sp_mode == "deepcompile")
    if wants_dc and accel.device_name() == "cpu":
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
        losses = train(args, ds_config, use_sp=args.sequence_parallel > 1, writer=writer)
        if args.sp_check:
            ok = sp_check(args, ds_config, losses)
            # the verdict goes to the metrics file too: dstui tags the run PASS/FAIL from it
            writer.write(SUMMARY, steps=args.steps, verdict="PASS" if ok else "FAIL", check="sp-check")
            code = 0 if ok else 1
    except RunnerError as e:
        print(f"[rank {rank}] train.py: error: {e}", file=sys.stderr, flush=True)
        code = 2
    except Exception:  # noqa: BLE001 - report any failure with its traceback and a non-zero exit
        print(f"[rank {rank}] train.py: training failed:", file=sys.stderr, flush=True)
        traceback.print_exc()
        sys.stderr.flush()
        code = 1
    finally:
        writer.close()
    if code == 0:
        common.leave_process_group()
    return code


if __name__ == "__main__":
    common.exit_now(main())  # the metrics file is closed and the group left by then
