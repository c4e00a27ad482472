"""The sp-check: train again without sequence parallelism on the same samples and compare the losses.

The tolerance is not a fixed number. By default it is derived, per logged step, from

* the measured noise: a second run without SP that differs from the reference
  only in what is legitimately allowed to differ -- with torch.compile for the
  compile modes (eager vs compile without SP: the kernels' own rounding), else
  the reference repeated (nondeterminism). ``NOISE_FACTOR`` times the largest
  noise of any logged step;
* the dtype: ``DTYPE_RTOL`` times |loss| (a quarter of the machine epsilon
  of bf16 / fp16; 1e-5 in fp32, where SP changes only the order of sums);

whichever is larger. A bf16 compile run whose losses differ by 6e-4 at a loss
of 5 passes (the dtype floor alone is 1e-2 there); a wrong head split in
the all-to-all moves the losses far beyond both. ``--sp-rtol``/``--sp-atol``
replace the derived tolerance. The verdict line names the margin used.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from trainer import Trainer

NOISE_FACTOR = 4.0
# bf16 eps 2^-7, fp16 eps 2^-10: a quarter of each; fp32: reduction-order level.
DTYPE_RTOL = {"bf16": 2.0**-9, "fp16": 2.0**-12, "fp32": 1e-5}
ATOL_FLOOR = 1e-6


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
    destroy = getattr(tr.engine, "destroy", None)
    if destroy is not None:
        destroy()
    return losses


def noise_twin(args: argparse.Namespace) -> tuple[argparse.Namespace, str]:
    """The arguments of the noise run and what it measures."""
    twin = argparse.Namespace(**vars(args))
    if args.sp_mode in ("compile", "deepcompile"):
        twin.compile = True
        return twin, "no-SP eager vs no-SP torch.compile"
    return twin, "no-SP run repeated"


def tolerances(
    ref: list[float], noise: list[float] | None, dtype: str
) -> tuple[list[float], str]:
    """Per logged step: the absolute tolerance, and a sentence naming which term set it."""
    worst_noise = max((abs(a - b) for a, b in zip(ref, noise or [], strict=False)), default=0.0)
    rtol = DTYPE_RTOL.get(dtype, DTYPE_RTOL["fp32"])
    tols = [max(NOISE_FACTOR * worst_noise, rtol * abs(r), ATOL_FLOOR) for r in ref]
    how = (
        f"derived: max({NOISE_FACTOR:g} x measured noise {worst_noise:.2e}, "
        f"{dtype} rtol {rtol:.2e} x |loss|, {ATOL_FLOOR:g})"
    )
    return tols, how


def compare(
    sp: list[float], ref: list[float], tols: list[float]
) -> tuple[bool, float, list[str]]:
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


def run(args: argparse.Namespace, ds_config: dict[str, Any], sp_losses: list[float]) -> dict:
    """Run the reference (and the noise twin unless tolerances were given); print and return the verdict."""
    import deepspeed
    import ulysses

    ulysses.reset()
    ref = train_reference(argparse.Namespace(**vars(args)), ds_config)
    if args.sp_rtol is not None or args.sp_atol is not None:
        rtol, atol = args.sp_rtol or 0.0, args.sp_atol or 0.0
        tols = [max(atol, rtol * abs(r)) for r in ref]
        how, noise_what, noise = f"given: rtol {rtol:g}, atol {atol:g}", None, None
    else:
        twin, noise_what = noise_twin(args)
        noise = train_reference(twin, ds_config)
        tols, how = tolerances(ref, noise, args.dtype)
    ok, margin, lines = compare(sp_losses, ref, tols)
    if deepspeed.comm.get_rank() == 0:
        verdict = "match" if ok else "DIFFER"
        noise_note = f"; noise run: {noise_what}" if noise_what else ""
        print(f"sp-check: losses {verdict} (tolerance {how}{noise_note})", flush=True)
        print(f"sp-check: margin {margin:.3g} (tolerance / largest difference)", flush=True)
        print("\n".join(lines), flush=True)
    return {
        "verdict": "PASS" if ok else "FAIL",
        "check": "sp-check",
        "tolerance": how,
        "margin": margin if math.isfinite(margin) else None,
        "max_abs_diff": max((abs(a - b) for a, b in zip(sp_losses, ref, strict=False)), default=None),
    }
