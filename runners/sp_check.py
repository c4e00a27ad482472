"""The sp-check: train again without sequence parallelism on the same samples; compare tensors, then losses.

Two comparisons, both must hold for a PASS:

* **tensors at step 1** (runners/sp_tensors.py): Q/K/V before and after the exchange and
  the attention outputs of chosen layers (``--sp-check-layers``) against the no-SP run's
  slices; a FAIL names the first layer and stage that differ. Every run captures them in an
  eager forward of step 1's first micro batch before its first step (runners/sp_probe.capture),
  so what each run compiles and times is what it would be without the check;
* **losses at every logged step** (below), within a tolerance derived per logged step from
  the measured noise (``NOISE_FACTOR`` times the largest difference between the reference
  and a second no-SP run that differs only in what may legitimately differ) and the dtype
  (``DTYPE_RTOL`` times |loss|: a quarter of bf16's / fp16's machine epsilon, 1e-5 in fp32),
  whichever is larger. ``--sp-rtol``/``--sp-atol`` replace it (and skip the noise run).

The no-SP runs start from a clean DeepSpeed state: the SP engine leaves its mpu in
``deepspeed.utils.groups.mpu``, which DeepSpeed consults for every later engine; under it
``groups._get_data_parallel_group()`` returns None, and a DeepCompile engine hands that to
its native op (SIGSEGV in ``_initialize_deepcompile_native``). The reference is eager (the
config's ``compile.deepcompile`` removed); the noise twin is compiled as the SP run was (no-SP
torch.compile, no-SP DeepCompile) or, for eager and ring, the reference repeated.

The no-SP runs are timed as well (same ranks, same sequence length): the summary carries
the one run the same way as the SP run (``nosp_*``), for the report's sequence-parallel section.
"""

from __future__ import annotations

import argparse
import copy
import math
from typing import Any

import sp_attention
import sp_tensors
from loop import timing_summary
from sp_probe import Probe
from trainer import Trainer, compile_mode

NOISE_FACTOR = 4.0
# bf16 eps 2^-7, fp16 eps 2^-10: a quarter of each; fp32: reduction-order level.
DTYPE_RTOL = {"bf16": 2.0**-9, "fp16": 2.0**-12, "fp32": 1e-5}
ATOL_FLOOR = 1e-6
MODE_WORDS = {"eager": "eager", "compile": "torch.compile", "deepcompile": "DeepCompile"}


def clean_state() -> None:
    """What the SP run left that a no-SP engine must not inherit: DeepSpeed's global mpu, the attention slot."""
    from deepspeed.utils import groups

    groups.mpu = None
    sp_attention.reset()


def eager_config(ds_config: dict[str, Any]) -> dict[str, Any]:
    """The config without DeepCompile (the reference runs eager; the twin adds it back if it should)."""
    cfg = copy.deepcopy(ds_config)
    comp = cfg.get("compile")
    if isinstance(comp, dict):
        comp.pop("deepcompile", None)
        if not comp:
            cfg.pop("compile")
    return cfg


def train_reference(
    args: argparse.Namespace, ds_config: dict[str, Any], probe: Probe | None = None
) -> tuple[list[float], dict[str, Any]]:
    """A no-SP run on the full micro batches each SP group saw: (logged losses, its timing and peak memory)."""
    clean_state()
    tr = Trainer(args, ds_config, use_sp=False, probe=probe, reference=True)
    on_gpu = not tr.dev["on_cpu"]
    if on_gpu:
        tr.accel.reset_peak_memory_stats()  # the SP engine's peak is not this run's
    losses, times = [], []
    for step in range(1, args.steps + 1):
        dt, total = tr.step()
        times.append(dt)
        if step % args.log_interval == 0 or step == args.steps:
            losses.append(tr.global_loss(total)[0])
    perf: dict[str, Any] = {"mode": MODE_WORDS[tr.compile_mode]}
    perf.update(timing_summary(times, args.warmup_steps, tr.tokens_per_step, tr.tflops_per_gpu, tr.peak))
    perf["mem_peak_max"] = tr.memory()[1] if on_gpu else None  # CPU: the process's RSS peak, not this run's
    destroy = getattr(tr.engine, "destroy", None)
    if destroy is not None:
        destroy()
    return losses, perf


def no_sp_args(args: argparse.Namespace) -> argparse.Namespace:
    ref = argparse.Namespace(**vars(args))
    ref.compile = ref.deepcompile = False
    return ref


def noise_twin(args: argparse.Namespace) -> tuple[argparse.Namespace, str]:
    """The arguments of the noise run and what it measures."""
    twin = no_sp_args(args)
    mode = compile_mode(args, args.sequence_parallel)
    if mode == "deepcompile":
        twin.deepcompile = True
    elif mode == "compile":
        twin.compile = True
    else:
        return twin, "no-SP run repeated"
    return twin, f"no-SP eager vs no-SP {MODE_WORDS[mode]}"


def tolerances(ref: list[float], noise: list[float] | None, dtype: str) -> tuple[list[float], str]:
    """Per logged step: the absolute tolerance, and a sentence naming which term set it."""
    worst_noise = max((abs(a - b) for a, b in zip(ref, noise or [], strict=False)), default=0.0)
    rtol = DTYPE_RTOL.get(dtype, DTYPE_RTOL["fp32"])
    tols = [max(NOISE_FACTOR * worst_noise, rtol * abs(r), ATOL_FLOOR) for r in ref]
    how = (
        f"derived: max({NOISE_FACTOR:g} x measured noise {worst_noise:.2e}, "
        f"{dtype} rtol {rtol:.2e} x |loss|, {ATOL_FLOOR:g})"
    )
    return tols, how


def compare(sp: list[float], ref: list[float], tols: list[float]) -> tuple[bool, float, list[str]]:
    """(all within tolerance, the smallest margin tol/|diff|, one line per logged step)."""
    ok = len(sp) == len(ref)
    margin = math.inf
    lines = []
    for i, (a, b, tol) in enumerate(zip(sp, ref, tols, strict=False)):
        diff = abs(a - b)
        close = diff <= tol
        ok = ok and close
        margin = min(margin, tol / diff if diff else math.inf)
        lines.append(
            f"  logged step {i + 1}: sp {a:.6f}  no-sp {b:.6f}  diff {a - b:+.3e}  "
            f"tol {tol:.2e}  {'ok' if close else 'DIFF'}"
        )
    return ok, margin, lines


def logged_steps(args: argparse.Namespace) -> list[int]:
    return [s for s in range(1, args.steps + 1) if s % args.log_interval == 0 or s == args.steps]


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def run(args: argparse.Namespace, ds_config: dict[str, Any], sp_losses: list[float], probe: Probe) -> dict[str, Any]:
    """Run the reference (and the noise twin unless tolerances were given); print and return the verdict."""
    import deepspeed

    ref_probe = Probe(probe.wanted)
    ref, ref_perf = train_reference(no_sp_args(args), eager_config(ds_config), ref_probe)
    twin_probe, noise, noise_what, like = None, None, None, ref_perf
    if args.sp_rtol is not None or args.sp_atol is not None:
        rtol, atol = args.sp_rtol or 0.0, args.sp_atol or 0.0
        tols, how = [max(atol, rtol * abs(r)) for r in ref], f"given: rtol {rtol:g}, atol {atol:g}"
    else:
        twin, noise_what = noise_twin(args)
        twin_probe = Probe(probe.wanted)
        noise, twin_perf = train_reference(twin, eager_config(ds_config), twin_probe)
        like = twin_perf if twin.compile or twin.deepcompile else ref_perf
        tols, how = tolerances(ref, noise, args.dtype)
    if like["mode"] != MODE_WORDS[compile_mode(args, args.sequence_parallel)]:
        like = None  # given tolerances, compiled SP run: no no-SP run compiled the same way
    loss_ok, margin, loss_lines = compare(sp_losses, ref, tols)
    device = _device()
    measured = sp_tensors.noise(ref_probe, twin_probe, device)
    rows = sp_tensors.compare(probe, ref_probe, measured, args.dtype, device)
    t_ok, t_margin, first = sp_tensors.verdict(rows)
    steps = logged_steps(args)
    bad_loss = next((steps[i] for i, (a, b, t) in enumerate(zip(sp_losses, ref, tols, strict=False)) if abs(a - b) > t), None)
    result: dict[str, Any] = {
        "verdict": "PASS" if loss_ok and t_ok else "FAIL", "check": "sp-check",
        "tolerance": how, "margin": _finite(margin),
        "max_abs_diff": max((abs(a - b) for a, b in zip(sp_losses, ref, strict=False)), default=None),
        "tensor_verdict": "PASS" if t_ok else "FAIL", "tensor_margin": _finite(t_margin),
        "tensor_max_rel": _finite(max((r.rel for r in rows), default=math.inf)),
        "tensor_tolerance": sp_tensors.tolerance_words(args.dtype, measured),
        "tensor_layers": list(probe.layers), "noise_run": noise_what,
        "first_diverging_step": 1 if not t_ok else bad_loss,
    }  # fmt: skip
    if first is not None:
        result["first_difference"] = {"layer": first.layer, "stage": first.label, "tensor": first.name,
                                      "rel": _finite(first.rel), "tol": first.tol, "token": first.token, "head": first.head}  # fmt: skip
        result["reason"] = f"tensors differ at step 1, first at {first.words()}"
    elif not loss_ok and bad_loss is not None:
        result["reason"] = f"losses differ from logged step {bad_loss} on (tolerance {how})"
    elif not loss_ok:
        result["reason"] = f"{len(sp_losses)} logged losses against the reference's {len(ref)}"
    if like is not None:
        result.update({f"nosp_{k}": like[k] for k in ("iter_time_mean", "tokens_per_s_mean", "mem_peak_max")})
        result["nosp_mode"] = like["mode"]
    if deepspeed.comm.get_rank() == 0:
        _print(result, how, noise_what, margin, loss_ok, loss_lines, rows, t_margin, first)
    return result


def _device() -> str:
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().current_device_name()


def _print(result: dict[str, Any], how: str, noise_what: str | None, margin: float, loss_ok: bool,
           loss_lines: list[str], rows: list[sp_tensors.Row], t_margin: float, first: sp_tensors.Row | None) -> None:  # fmt: skip
    layers = ", ".join(str(x) for x in result["tensor_layers"])
    if first is None:
        print(f"sp-check: tensors match at step 1 (layers {layers}; tolerance {result['tensor_tolerance']}); "
              f"margin {t_margin:.3g}", flush=True)  # fmt: skip
    else:
        print(f"sp-check: tensors DIFFER at step 1: first at {first.words()}", flush=True)
    print("\n".join(sp_tensors.lines(rows)), flush=True)
    noise_note = f"; noise run: {noise_what}" if noise_what else ""
    print(f"sp-check: losses {'match' if loss_ok else 'DIFFER'} (tolerance {how}{noise_note})", flush=True)
    print(f"sp-check: margin {margin:.3g} (tolerance / largest difference)", flush=True)
    print("\n".join(loss_lines), flush=True)
    print(f"sp-check: {result['verdict']}", flush=True)
