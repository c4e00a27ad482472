"""Deliberate gradient-reduction faults in a real DeepSpeed engine, to prove the parity check catches them.

``compare_loss.py`` imports this only when ``DSTUI_PARITY_INJECT`` names a
fault. The patches go on the *instances* of the engine and of its ZeRO
optimizer (never on DeepSpeed's classes), at the points where real
regressions lived: the flush of one gradient bucket and the scaling of the
loss over accumulation steps. Format::

    DSTUI_PARITY_INJECT=<fault>[:step=N][:bucket=K]

``step`` is the 1-based optimizer step (default 2), ``bucket`` the 0-based
bucket flush within the last micro-step of that step (default 0). Faults:

* ``drop_bucket``: the bucket's gradients are zeroed before they are reduced,
  so its contribution of that micro-step is lost on every rank.
* ``double_grad``: the first parameter of the bucket enters the reduction twice
  (its gradient is doubled before the reduce), as when a hook fires twice.
* ``skip_gas_scaling``: ``engine.backward`` stops dividing the loss by the
  gradient accumulation steps, from ``step`` on.

Faults of the whole step's gradient, at any ZeRO stage (runners/parity_faults.py):

* ``gas_scaled_twice``: the loss is divided by the accumulation steps once
  more (a uniform 1/GAS: what output hooks that scale did to the loss).
* ``rank_local``: the step's gradient reductions see only this rank's data,
  so each rank applies its own gradient instead of the mean.
* ``drop_micro``: micro-batch ``micro`` (1-based, default 1) of the step adds
  nothing to the gradient, on every rank.
* ``stage_scale``: pipeline runs only: the gradient of pipeline stage
  ``stage`` (default 1) is divided by the accumulation steps once more.
* ``norm_doubled``: ZeRO-1/2 only: the global norm the step clips by (and
  reports) is twice the gradient's; the gradients themselves are right.

Each patch prints ``parity_inject: ...`` naming the parameters it touched, so a
test can check that the check names the same ones.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import parity_faults

ENV = "DSTUI_PARITY_INJECT"
FAULTS = ("drop_bucket", "double_grad", "skip_gas_scaling", "gas_scaled_twice", "rank_local", "drop_micro",
          "stage_scale", "norm_doubled")
OPTIONS = ("step", "bucket", "micro", "stage")


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int = 2
    bucket: int = 0
    micro: int = 1
    stage: int = 1


def parse(text: str) -> Fault:
    """``drop_bucket:step=3:bucket=1`` -> Fault; a bad text raises ValueError naming the variable."""
    kind, *opts = text.strip().split(":")
    if kind not in FAULTS:
        raise ValueError(f"{ENV}: unknown fault '{kind}' (known: {', '.join(FAULTS)})")
    values: dict[str, int] = {}
    for opt in opts:
        key, _, value = opt.partition("=")
        if key not in OPTIONS or not value.isdigit():
            raise ValueError(f"{ENV}: bad option '{opt}' (use step=N, bucket=K, micro=M, stage=S)")
        values[key] = int(value)
    fault = Fault(kind, **values)
    if fault.step < 1 or fault.micro < 1:
        raise ValueError(f"{ENV}: step and micro must be >= 1")
    return fault


def from_env() -> Fault | None:
    text = os.environ.get(ENV, "").strip()
    return parse(text) if text and text != "none" else None


class _Injector:
    """Counts micro-steps and bucket flushes; decides when the fault fires."""

    def __init__(self, engine: Any, fault: Fault, names: dict[int, str]) -> None:
        self.engine = engine
        self.fault = fault
        self.names = names
        self.flushes = 0  # bucket flushes in the current micro-step
        self.fired = False

    def at_target_micro_step(self) -> bool:
        e = self.engine
        return e.global_steps + 1 == self.fault.step and e.is_gradient_accumulation_boundary()

    def on_flush(self, grads: list[tuple[Any, Any]]) -> None:
        """``grads``: (param, gradient tensor about to be reduced) of one bucket."""
        index = self.flushes
        self.flushes += 1
        if self.fired or not grads or not self.at_target_micro_step() or index != self.fault.bucket:
            return
        self.fired = True
        if self.fault.kind == "drop_bucket":
            for _, g in grads:
                g.zero_()
            touched = [self.names.get(id(p), "?") for p, _ in grads]
        else:  # double_grad
            p, g = grads[0]
            g.mul_(2.0)
            touched = [self.names.get(id(p), "?")]
        print(f"parity_inject: {self.fault.kind} at step {self.fault.step} bucket {index}: "
              f"{', '.join(touched)}", flush=True)


def install(engine: Any, fault: Fault) -> None:
    """Patch ``engine`` (and its ZeRO optimizer) so that ``fault`` happens."""
    if fault.kind in parity_faults.STEP_FAULTS:
        parity_faults.install(engine, fault)
        return
    names = {id(p): n for n, p in engine.module.named_parameters()}
    inj = _Injector(engine, fault, names)
    backward = engine.backward

    def patched_backward(loss: Any, *args: Any, **kwargs: Any) -> Any:
        inj.flushes = 0
        if fault.kind == "skip_gas_scaling" and engine.global_steps + 1 >= fault.step:
            if not inj.fired:
                inj.fired = True
                print(f"parity_inject: skip_gas_scaling from step {fault.step}", flush=True)
            kwargs["scale_wrt_gas"] = False
        return backward(loss, *args, **kwargs)

    engine.backward = patched_backward
    if fault.kind == "skip_gas_scaling":
        return
    opt = engine.optimizer
    if hasattr(opt, "_DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads"):
        attr = "_DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads"
        original = getattr(opt, attr)

        def flush3(comm_dtype: Any, *a: Any, **kw: Any) -> Any:
            params = list(opt.ipg_buckets[comm_dtype].params)
            inj.on_flush([(p, p.grad) for p in params if p.grad is not None])
            return original(comm_dtype, *a, **kw)

        setattr(opt, attr, flush3)
    elif hasattr(opt, "reduce_ipg_grads"):
        original12 = opt.reduce_ipg_grads

        def flush12(comm_dtype: Any = None, *a: Any, **kw: Any) -> Any:
            grads = []
            for dtype, bucket in opt.ipg_buckets.items():
                if comm_dtype is not None and dtype != comm_dtype:
                    continue
                for group, idx, _pid in bucket.params:
                    p = opt.bit16_groups[group][idx]
                    g = opt.get_gradient_for_reduction(p)
                    if g is not None:
                        grads.append((p, g))
            inj.on_flush(grads)
            return original12(comm_dtype, *a, **kw)

        opt.reduce_ipg_grads = flush12
    else:
        raise SystemExit(f"compare_loss.py: error: {ENV}={fault.kind} needs ZeRO stage 1, 2 or 3 "
                         f"(this engine's optimizer is {type(opt).__name__})")
