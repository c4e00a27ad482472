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

Gradient clipping is switched off in the flag-built config (``base.json`` sets
it): a clipped update depends on the global gradient norm, which DeepSpeed sums
per partition and the baseline per tensor, so clipping alone breaks exactness.
A config given with ``--ds-config`` is used as it is; its ``gradient_clipping``
is mirrored in the baseline with ``clip_grad_norm_`` (expect a tolerance then).

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
import json
import math
import os
import resource
import socket
import statistics
import sys
import time
import traceback
from collections.abc import Iterator
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

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from deepspeed.accelerator import get_accelerator  # noqa: E402
from deepspeed.utils import safe_get_full_grad  # noqa: E402
from parity import (  # noqa: E402  (needs the sys.path lines above)
    TORCH_DTYPES,
    canonical_dtype,
    compare_named,
    divergence_reason,
    option_names,
    rank_slice,
    scalar_diff,
    synthetic_batch,
    verdict_line,
)
from pydantic import ValidationError  # noqa: E402

from dstui.core.records import HEADER, STEP, SUMMARY, MetricsWriter  # noqa: E402
from dstui.spec import dsconfig  # noqa: E402
from dstui.spec.models import Settings  # noqa: E402

MODELS_DIR = _REPO / "configs" / "models"

# --inject lr multiplies the DeepSpeed side's learning rate by this.
LR_INJECT_FACTOR = 2.0
# --inject grad scales the DeepSpeed loss before backward at --inject-step, so
# every gradient of that step is off by 1% while the reported loss is not.
GRAD_INJECT_FACTOR = 1.01


# -- options -----------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """Options named like dstui Settings (dash form), with the seed's spellings too."""
    p = argparse.ArgumentParser(
        prog="compare_loss.py",
        description="DeepSpeed ZeRO vs plain PyTorch parity (loss, gradients, parameters).",
    )
    p.add_argument("--local_rank", "--local-rank", type=int, default=-1, help="Set by the launcher.")
    p.add_argument(*option_names("model"), default="tiny-llama",
                   help="Preset in configs/models/, a config .json or a local model folder.")
    p.add_argument(*option_names("seq_length"), type=int, default=64)
    p.add_argument(*option_names("micro_batch"), type=int, default=1)
    p.add_argument(*option_names("steps"), type=int, default=5)
    p.add_argument(*option_names("seed"), type=int, default=42)
    p.add_argument(*option_names("lr"), type=float, default=1e-3,
                   help="AdamW learning rate (large enough that an lr bug shows at step 1).")
    p.add_argument(*option_names("dtype"), type=canonical_dtype, default="fp32",
                   help="fp32, bf16, fp16 (or torch.float32, torch.bfloat16, torch.float16).")
    p.add_argument(*option_names("zero_stage"), type=int, choices=[0, 1, 2, 3], default=1)
    p.add_argument(*option_names("offload", "--offload_device", "--offload-device"),
                   choices=["none", "cpu", "nvme"], default="none",
                   help="Optimizer-state offload (ZeRO >= 1).")
    p.add_argument(*option_names("offload_params"), choices=["none", "cpu", "nvme"],
                   default="none", help="Parameter offload (ZeRO-3).")
    p.add_argument(*option_names("nvme_path"), default="/tmp/dstui_nvme")
    p.add_argument(*option_names("torch_adam", "--use_torch_adam", "--use-torch-adam"),
                   action="store_true",
                   help="torch.optim.AdamW on the DeepSpeed side too (the exact-parity setting).")
    p.add_argument(*option_names("mirror_zero3_hooks"), action="store_true",
                   help="Wrap the baseline's module inputs/outputs like ZeRO-3 does, so both sides "
                        "sum gradients in the same order (isolates ZeRO-3's partitioning).")
    p.add_argument(*option_names("rtol"), type=float, default=0.0)
    p.add_argument(*option_names("atol"), type=float, default=0.0)
    p.add_argument(*option_names("compile"), action="store_true",
                   help="torch.compile both the engine and the baseline.")
    p.add_argument(*option_names("deepcompile"), action="store_true",
                   help="DeepSpeed DeepCompile (compile.deepcompile); implies --compile for the engine.")
    p.add_argument(*option_names("verbose_logging"), action="store_true",
                   help="torch._logging recompiles/guards/graph breaks.")
    p.add_argument(*option_names("ds_config"), default=None,
                   help="A generated DeepSpeed config, used as it is (else built from the flags).")
    p.add_argument(*option_names("metrics_file"),
                   default=os.environ.get("DSTUI_METRICS_FILE"),
                   help="metrics.jsonl to append to (default: $DSTUI_METRICS_FILE).")
    p.add_argument("--inject", choices=["none", "lr", "grad"], default="none",
                   help="Deliberately break DeepSpeed's side to prove the check catches it.")
    p.add_argument("--inject-step", "--inject_step", type=int, default=3,
                   help="Step whose gradient --inject grad perturbs (1-based).")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.deepcompile:
        args.compile = True
    return args


def settings_of(args: argparse.Namespace, world: int) -> Settings:
    """The dstui Settings these flags describe (validated: offload needs ZeRO, ...)."""
    return Settings(
        kind="verify",
        model=args.model,
        dataset="synthetic",
        seq_length=args.seq_length,
        micro_batch=args.micro_batch,
        steps=args.steps,
        warmup_steps=0,
        dtype=args.dtype,
        zero_stage=args.zero_stage,
        offload=args.offload,
        offload_params=args.offload_params,
        nvme_path=args.nvme_path,
        deepcompile=args.deepcompile,
        compile=args.compile,
        lr=args.lr,
        torch_adam=args.torch_adam,
        seed=args.seed,
        gpus=world,
        rtol=args.rtol,
        atol=args.atol,
    )


def ds_config_of(args: argparse.Namespace, world: int) -> dict[str, Any]:
    """The DeepSpeed config: ``--ds-config`` as it is, else base.json + the flags."""
    if args.ds_config:
        return json.loads(Path(args.ds_config).read_text())
    try:
        s = settings_of(args, world)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "options"
        raise SystemExit(f"compare_loss: {where}: {first['msg']}") from None
    cfg = dsconfig.deep_merge(dsconfig.load_template("base.json"), dsconfig.from_settings(s))
    cfg["gradient_clipping"] = 0.0  # see the module docstring: clipping breaks exactness
    cfg["steps_per_print"] = 10**9
    return cfg


# -- model and optimizers ------------------------------------------------------


def load_model_config(name: str) -> Any:
    """A transformers config from a preset name, a .json file or a local folder (no hub)."""
    from transformers import AutoConfig

    path = Path(name)
    preset = MODELS_DIR / f"{name}.json"
    if preset.is_file() or (path.suffix == ".json" and path.is_file()):
        data = json.loads((preset if preset.is_file() else path).read_text())
        model_type = data.pop("model_type")
        return AutoConfig.for_model(model_type, **data)
    if path.is_dir():
        return AutoConfig.from_pretrained(str(path), local_files_only=True)
    known = ", ".join(sorted(p.stem for p in MODELS_DIR.glob("*.json")))
    raise SystemExit(f"compare_loss: unknown model '{name}' (presets: {known}; or a local path)")


def adam_spec(cfg: dict[str, Any], lr: float) -> tuple[str, dict[str, Any]]:
    """(class name, kwargs) of the torch optimizer equivalent to the config's.

    DeepSpeed's "Adam" type means AdamW unless ``adam_w_mode`` is false; with no
    optimizer block the runner hands DeepSpeed a torch AdamW itself.
    """
    opt = cfg.get("optimizer")
    if not opt:
        return "AdamW", {"lr": lr, "weight_decay": 0.0}
    params = dict(opt.get("params", {}))
    kind = str(opt.get("type", "AdamW")).lower()
    adam_w = kind == "adamw" or bool(params.get("adam_w_mode", True))
    kwargs = {k: params[k] for k in ("lr", "betas", "eps", "weight_decay") if k in params}
    kwargs.setdefault("lr", lr)
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    if kind not in ("adam", "adamw"):
        print(f"compare_loss: optimizer type '{opt.get('type')}' has no torch twin; "
              "the baseline uses AdamW with the same lr", flush=True)
    return ("AdamW" if adam_w else "Adam"), kwargs


def make_torch_opt(params: Any, kind: str, kwargs: dict[str, Any]) -> torch.optim.Optimizer:
    return getattr(torch.optim, kind)(params, **kwargs)


# -- measuring -----------------------------------------------------------------


def mem_now() -> tuple[int, int]:
    """(allocated, peak) bytes: CUDA allocator on GPU, process RSS / peak RSS on CPU."""
    if torch.cuda.is_available():
        return torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    try:
        with open("/proc/self/statm") as fh:
            rss = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        rss = peak
    return rss, peak


def git_sha() -> str | None:
    try:
        from deepspeed.git_version_info import git_hash
    except ImportError:
        return None
    return None if not git_hash or git_hash.startswith("[") else str(git_hash)


class _Identity(torch.autograd.Function):
    """What ZeRO-3 puts around module inputs and outputs: x.detach() forward, grad as is."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def mirror_zero3_hooks(model: torch.nn.Module) -> None:
    """Give the baseline the autograd graph that ZeRO-3 gives the engine's model.

    ZeRO-3 (deepspeed/runtime/zero/parameter_offload.py) wraps the tensor inputs
    (forward pre-hook, ``PostBackwardFunctionModule``) and outputs (forward
    hook, ``PreBackwardFunctionForModule``) of *every* module in identity
    autograd Functions so it learns when a module's backward starts and ends.
    They do not change values, but they change how autograd groups the sum of
    gradients of a tensor used three or more times: the residual stream feeds
    the residual add and an RMSNorm that uses its input twice, and
    ``r + (p + m)`` is not ``(r + m) + p`` in floating point. With this the
    baseline sums in the same grouping, so what remains to compare is ZeRO-3's
    partitioning and communication. Uses DeepSpeed's own traversal of nested
    outputs so that the same tensors get wrapped.
    """
    from deepspeed.runtime.zero.utils import apply_to_tensors_only

    def wrap(obj: Any) -> Any:
        return apply_to_tensors_only(_Identity.apply, obj)

    for module in model.modules():
        module.register_forward_pre_hook(lambda _m, inputs: wrap(inputs))
        module.register_forward_hook(lambda _m, _inputs, output: wrap(output))


@contextlib.contextmanager
def gathered(params: list[Any], stage: int) -> Iterator[None]:
    """Full parameters on every rank: GatheredParameters under ZeRO-3, a no-op below."""
    if stage == 3:
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            yield
    else:
        yield


# -- the run -------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    """Train both sides for ``args.steps`` steps; return the exit code (0 PASS, 1 FAIL)."""
    if args.verbose_logging:
        torch._logging.set_logs(recompiles=True, guards=True, graph_breaks=True)

    if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" not in os.environ:
        # Started without a launcher: one rank, instead of DeepSpeed's MPI discovery.
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    deepspeed.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    accel = get_accelerator()
    device_name = accel.device_name()
    local_rank = int(os.environ.get("LOCAL_RANK", max(args.local_rank, 0)))
    if device_name != "cpu":
        accel.set_device(local_rank)
    device = torch.device(accel.current_device_name())

    cfg = ds_config_of(args, world)
    stage = int(cfg.get("zero_optimization", {}).get("stage", 0))
    dtype_name = (
        "bf16" if cfg.get("bf16", {}).get("enabled") else
        "fp16" if cfg.get("fp16", {}).get("enabled") else "fp32"
    )
    micro = int(cfg.get("train_micro_batch_size_per_gpu", args.micro_batch))
    if int(cfg.get("gradient_accumulation_steps", 1)) != 1:
        raise SystemExit("compare_loss: gradient_accumulation_steps must be 1")
    # An absent key is not "no clipping": DeepSpeed's default clips at 1.0, and the
    # baseline must do what DeepSpeed does.
    from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT

    clip = float(cfg.get("gradient_clipping", GRADIENT_CLIPPING_DEFAULT) or 0.0)
    opt_kind, opt_kwargs = adam_spec(cfg, args.lr)

    writer = MetricsWriter(args.metrics_file if rank == 0 else None)
    try:
        return _train(args, cfg, writer, rank=rank, world=world, device=device,
                      device_name=device_name, stage=stage, dtype_name=dtype_name, micro=micro,
                      clip=clip, opt_kind=opt_kind, opt_kwargs=opt_kwargs)
    except BaseException as e:
        writer.write(SUMMARY, status="failed", error=f"{type(e).__name__}: {e}",
                     traceback=traceback.format_exc(limit=5))
        raise
    finally:
        writer.close()


def _train(args: argparse.Namespace, cfg: dict[str, Any], writer: MetricsWriter, *, rank: int,
           world: int, device: Any, device_name: str, stage: int, dtype_name: str, micro: int,
           clip: float, opt_kind: str, opt_kwargs: dict[str, Any]) -> int:
    from transformers import AutoModelForCausalLM

    model_cfg = load_model_config(args.model)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(model_cfg)
    model.train()
    # The baseline is a copy of the initial weights taken before DeepSpeed
    # partitions, casts or moves anything.
    baseline = copy.deepcopy(model).to(device)
    if args.mirror_zero3_hooks:
        mirror_zero3_hooks(baseline)
    base_opt = make_torch_opt(baseline.parameters(), opt_kind, opt_kwargs)

    ds_cfg = copy.deepcopy(cfg)
    ds_kwargs = dict(opt_kwargs)
    if args.inject == "lr":
        ds_kwargs["lr"] = opt_kwargs["lr"] * LR_INJECT_FACTOR
        if ds_cfg.get("optimizer"):
            ds_cfg["optimizer"].setdefault("params", {})["lr"] = ds_kwargs["lr"]
    client_opt = None if ds_cfg.get("optimizer") else make_torch_opt(model.parameters(), opt_kind, ds_kwargs)
    n_params = sum(p.numel() for p in model.parameters())
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), optimizer=client_opt, config=ds_cfg
    )
    if args.compile:
        engine.compile()
        baseline = torch.compile(baseline)

    amp_dtype = TORCH_DTYPES[dtype_name]
    use_amp = dtype_name != "fp32"
    scaler = None
    if dtype_name == "fp16":
        fp16 = cfg.get("fp16", {})
        # Mirror DeepSpeed's dynamic loss scaler as far as GradScaler can.
        scaler = torch.amp.GradScaler(
            device.type, init_scale=2.0 ** fp16.get("initial_scale_power", 16),
            growth_interval=fp16.get("loss_scale_window", 1000),
        )

    vocab = int(model_cfg.vocab_size)
    seq = args.seq_length
    tokens_per_step = micro * world * seq
    ds_named = list(engine.module.named_parameters())
    base_named = dict(
        (n.removeprefix("_orig_mod."), p) for n, p in baseline.named_parameters()
    )
    rtol, atol = args.rtol, args.atol

    if rank == 0:
        gpu_name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        writer.write(
            HEADER,
            runner="compare_loss",
            config={**vars(args), "world_size": world, "zero_stage": stage, "dtype": dtype_name},
            ds_config=cfg,
            versions=common.versions(),
            deepspeed_git_sha=git_sha(),
            device=device_name,
            gpu_name=gpu_name,
            gpu_count=torch.cuda.device_count() if torch.cuda.is_available() else 0,
            world_size=world,
            hostname=socket.gethostname(),
            tokens_per_step=tokens_per_step,
            params=n_params,
            flops_per_token=6 * n_params,
            peak_tflops=None,
            baseline_optimizer={"type": opt_kind, **opt_kwargs},
            gradient_clipping=clip,
        )
        print(f"compare_loss: ZeRO-{stage} {dtype_name} world={world} model={args.model} "
              f"optimizer={'client ' if client_opt is not None else ''}{opt_kind} "
              f"rtol={rtol:g} atol={atol:g} inject={args.inject}", flush=True)

    first_step: int | None = None
    first_reason = ""
    iter_times: list[float] = []
    maxima = {k: 0.0 for k in ("loss_abs_diff", "grad_max_abs_diff", "grad_max_rel_diff",
                               "param_max_abs_diff", "param_max_rel_diff")}
    mem_peak_max = 0
    final_loss = math.nan

    for step in range(1, args.steps + 1):
        batch = synthetic_batch(args.seed, step, global_batch=micro * world, seq_length=seq,
                                vocab_size=vocab)
        x = rank_slice(batch, rank, micro).to(device)

        # -- DeepSpeed side
        accel_sync()
        t0 = time.perf_counter()
        loss = engine(input_ids=x, labels=x).loss
        grad_scale = GRAD_INJECT_FACTOR if args.inject == "grad" and step == args.inject_step else 1.0
        engine.backward(loss * grad_scale if grad_scale != 1.0 else loss)
        ds_grads = {}
        for name, p in ds_named:
            g = safe_get_full_grad(p)  # collective: same order on every rank
            if g is not None:
                ds_grads[name] = g.detach().float().clone()
        if dtype_name == "fp16":
            ls = float(getattr(engine.optimizer, "loss_scale", 1.0) or 1.0)
            ds_grads = {n: g / ls for n, g in ds_grads.items()}
        engine.step()
        accel_sync()
        iter_time = time.perf_counter() - t0
        with gathered([p for _, p in ds_named], stage):
            ds_params = {n: p.detach().float().clone() for n, p in ds_named}

        # -- baseline: same micro-batch, then a data-parallel mean of the gradients
        base_opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=use_amp):
            base_loss = baseline(input_ids=x, labels=x).loss
        (scaler.scale(base_loss) if scaler else base_loss).backward()
        for p in baseline.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad.div_(world)
        if scaler:
            scaler.unscale_(base_opt)
        base_grads = {n: p.grad.detach().float().clone()
                      for n, p in base_named.items() if p.grad is not None}
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(baseline.parameters(), clip)
        if scaler:
            scaler.step(base_opt)
            scaler.update()
        else:
            base_opt.step()

        # -- compare
        loss_v, base_v = float(loss.detach().float()), float(base_loss.detach().float())
        loss_d, loss_ok = scalar_diff(loss_v, base_v, rtol, atol)
        missing = set(ds_grads) ^ set(base_grads)
        if missing:
            raise RuntimeError(f"gradients present on one side only: {sorted(missing)[:5]}")
        gdiff = compare_named(((n, ds_grads[n], base_grads[n]) for n in ds_grads), rtol, atol)
        pdiff = compare_named(((n, ds_params[n], base_named[n]) for n in ds_params), rtol, atol)

        # Every rank checked its own micro-batch; combine: means of losses, maxima of diffs.
        sums = torch.tensor([loss_v, base_v], dtype=torch.float64, device=device)
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        worst = torch.tensor([loss_d, gdiff.max_abs, gdiff.max_rel, pdiff.max_abs, pdiff.max_rel,
                              float(not loss_ok), float(not gdiff.ok), float(not pdiff.ok)],
                             dtype=torch.float64, device=device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        w = worst.tolist()
        mem_alloc, mem_peak = mem_now()
        mem_peak_max = max(mem_peak_max, mem_peak)
        within = not any(w[5:])
        final_loss = sums[0].item() / world
        rec: dict[str, Any] = {
            "step": step,
            "epoch": 1,
            "loss": final_loss,
            "loss_baseline": sums[1].item() / world,
            "loss_abs_diff": w[0],
            "grad_max_abs_diff": w[1],
            "grad_max_rel_diff": w[2],
            "param_max_abs_diff": w[3],
            "param_max_rel_diff": w[4],
            "loss_within_tol": int(not w[5]),
            "grad_within_tol": int(not w[6]),
            "param_within_tol": int(not w[7]),
            "within_tol": int(within),
            "iter_time": iter_time,
            "tokens_per_s": tokens_per_step / iter_time if iter_time > 0 else 0.0,
            "mem_alloc": mem_alloc,
            "mem_peak": mem_peak,
            "lr": float(engine.get_lr()[0]),
        }
        iter_times.append(iter_time)
        for k in maxima:
            maxima[k] = max(maxima[k], rec[k])
        if not within and first_step is None:
            first_step = step
            first_reason = divergence_reason(rec, rtol, atol, [
                gdiff.worst if not gdiff.ok else "", pdiff.worst if not pdiff.ok else ""])
        if rank == 0 and first_step == step:
            for what, d in (("grad", gdiff), ("param", pdiff)):
                for name, dmax, bad, n in sorted(d.offenders, key=lambda o: -o[1])[:24]:
                    print(f"  {what} {name}: max|d| {dmax:.3e}, {bad}/{n} elements out of tolerance",
                          flush=True)
        if rank == 0:
            writer.write(STEP, **rec)
            print(
                f"step {step}/{args.steps} loss {rec['loss']:.6f} baseline {rec['loss_baseline']:.6f} "
                f"|dloss| {rec['loss_abs_diff']:.3e} grad |d| {rec['grad_max_abs_diff']:.3e} "
                f"(rel {rec['grad_max_rel_diff']:.3e}) param |d| {rec['param_max_abs_diff']:.3e} "
                f"(rel {rec['param_max_rel_diff']:.3e}) {'ok' if within else 'DIVERGED'}",
                flush=True,
            )
            print(f"Epoch 1, Step {step}, Loss: {rec['loss']:.6f} sync: True time: {iter_time:.6f} "
                  f"alloc_mem: {mem_alloc} peak_mem: {mem_peak}", flush=True)

    verdict = "PASS" if first_step is None else "FAIL"
    if rank == 0:
        writer.write(
            SUMMARY,
            steps=args.steps,
            warmup_steps=0,
            iter_time_mean=statistics.fmean(iter_times),
            iter_time_std=statistics.pstdev(iter_times),
            tokens_per_s_mean=statistics.fmean(tokens_per_step / t for t in iter_times if t > 0),
            compile_time=iter_times[0] if args.compile else 0.0,
            mem_peak_max=mem_peak_max,
            final_loss=final_loss,
            verdict=verdict,
            first_diverging_step=first_step,
            reason=first_reason or None,
            rtol=rtol,
            atol=atol,
            **{f"{k}_max": v for k, v in maxima.items()},
            status="ok",
        )
        print(verdict_line(first_step, first_reason), flush=True)
    return 0 if verdict == "PASS" else 1


def accel_sync() -> None:
    """Wait for the device so that step times are real (a no-op on CPU)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    """Exit code: 0 PASS, 1 FAIL, 2 error.

    On an error the process leaves with ``os._exit``: a normal exit would run
    the process group's destructor, which blocks while the other rank waits in
    a collective, and the launcher would never see this rank die (the job
    hangs instead of failing). After ``_exit`` the launcher kills the peers.
    """
    args = parse_args(argv)
    try:
        code = run(args)
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
