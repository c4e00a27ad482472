"""Faults of a whole step's gradient, injected into a real engine at any ZeRO stage (and in pipelines).

The shapes issue 37 wants a verdict to name, each made the way a real bug
makes it (parity_inject.py lists them; ``$DSTUI_PARITY_INJECT`` selects one):

* ``gas_scaled_twice``: ``engine.backward`` gets the loss already divided by
  the accumulation steps, and divides again: every gradient is 1/GAS of what it
  should be (DeepSpeed applied 1/GAS through output hooks *and* in backward).
* ``rank_local``: during the step, DeepSpeed's gradient reductions
  (``deepspeed.comm`` all_reduce, reduce, reduce_scatter and their torch
  functions) return this rank's own contribution as if every rank had sent
  the same, so each rank applies its own gradient, never the mean.
* ``drop_micro``: one micro-batch's loss is multiplied by 0 before backward on
  every rank: its share of the step's gradient is lost.
* ``stage_scale``: in a pipeline, the rank of stage ``stage`` divides its
  applied gradient by the accumulation steps once more (stages that repeat the
  GA scaling); a step pre-hook on the optimizer that updates it.
* ``norm_doubled``: ZeRO-1/2 compute the step's global gradient norm twice as
  large (its ``scaled_global_norm``): the gradients are right, the clipping
  coefficient and the reported norm are not.

Each prints ``parity_inject: <fault> ...`` when it fires.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

STEP_FAULTS = ("gas_scaled_twice", "rank_local", "drop_micro", "stage_scale", "norm_doubled")
# reductions a "rank-local" step short-circuits (deepspeed.comm's backend object and torch.distributed alike)
REDUCTIONS = ("all_reduce", "reduce", "reduce_scatter_tensor", "reduce_scatter", "all_reduce_coalesced")


class _Done:
    """A finished work handle for an async_op caller."""

    def wait(self, *_: Any, **__: Any) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def _is_sum(op: Any) -> bool:
    name = str(getattr(op, "name", op)).upper()
    return "SUM" in name or op is None


# where each reduction takes ``op`` when it is given by position
OP_POSITION = {"all_reduce": 1, "all_reduce_coalesced": 1, "reduce": 2, "reduce_scatter_tensor": 2, "reduce_scatter": 2}


def _local(name: str, world: int, rank: int) -> Any:
    """A reduction that returns what it would if every rank had sent this rank's tensor.

    A sum becomes ``world`` times this rank's value; MAX/MIN (overflow checks) and
    integer flags are left as they are.
    """

    def reduce(*args: Any, **kwargs: Any) -> Any:
        at = OP_POSITION[name]
        op = kwargs.get("op", args[at] if len(args) > at else None)
        times = float(world) if _is_sum(op) else 1.0
        if name in ("all_reduce", "reduce"):
            t = kwargs.get("tensor", args[0] if args else None)
            if t.is_floating_point():
                t.mul_(times)
        elif name == "all_reduce_coalesced":
            for t in kwargs.get("tensors", args[0] if args else []):
                if t.is_floating_point():
                    t.mul_(times)
        elif name == "reduce_scatter_tensor":
            out = kwargs.get("output_tensor", kwargs.get("output", args[0] if args else None))
            inp = kwargs.get("input_tensor", kwargs.get("input", args[1] if len(args) > 1 else None))
            out.copy_(inp.reshape(-1).chunk(world)[rank].reshape(out.shape)).mul_(times)
        else:  # reduce_scatter(output, input_list)
            out = kwargs.get("output", args[0] if args else None)
            parts = kwargs.get("input_list", args[1] if len(args) > 1 else None)
            out.copy_(parts[rank]).mul_(times)
        return _Done()

    return reduce


@contextlib.contextmanager
def rank_local_reductions() -> Iterator[None]:
    """Within the block, every gradient reduction stays on its rank (see the module docstring)."""
    import deepspeed.comm.comm as ds_comm
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    targets = [obj for obj in (getattr(ds_comm, "cdb", None), dist) if obj is not None]
    saved = [(obj, name, getattr(obj, name)) for obj in targets for name in REDUCTIONS if hasattr(obj, name)]
    for obj, name, _ in saved:
        setattr(obj, name, _local(name, world, rank))
    try:
        yield
    finally:
        for obj, name, original in saved:
            setattr(obj, name, original)


def install(engine: Any, fault: Any) -> None:
    """Patch ``engine``'s backward/step (instance attributes only) so that ``fault`` happens at its step."""
    state = {"micro": 0, "said": False}
    backward, step = engine.backward, engine.step
    gas = int(engine.gradient_accumulation_steps())

    def at_step() -> bool:
        return engine.global_steps + 1 == fault.step

    def say(text: str) -> None:
        if not state["said"]:
            state["said"] = True
            print(f"parity_inject: {fault.kind} at step {fault.step}{text}", flush=True)

    def patched_backward(loss: Any, *args: Any, **kwargs: Any) -> Any:
        if not at_step():
            return backward(loss, *args, **kwargs)
        state["micro"] += 1
        if fault.kind == "gas_scaled_twice":
            say(f": loss / {gas} before backward")
            loss = loss / gas
        elif fault.kind == "drop_micro" and state["micro"] == fault.micro:
            say(f": micro-batch {fault.micro} dropped")
            loss = loss * 0.0
        elif fault.kind == "rank_local":
            say(": gradient reductions stay on their rank")
            with rank_local_reductions():
                return backward(loss, *args, **kwargs)
        return backward(loss, *args, **kwargs)

    def patched_step(*args: Any, **kwargs: Any) -> Any:
        if fault.kind == "rank_local" and at_step():
            with rank_local_reductions():
                return step(*args, **kwargs)
        return step(*args, **kwargs)

    if fault.kind == "stage_scale":
        install_stage_scale(engine, fault, gas)
        return
    if fault.kind == "norm_doubled":
        install_norm_doubled(engine, fault)
        return
    engine.backward = patched_backward
    engine.step = patched_step


def install_stage_scale(engine: Any, fault: Any, gas: int) -> None:
    """On the rank of pipeline stage ``fault.stage`` only: its applied gradient / GAS at ``fault.step``."""
    from parity_applied import basic_optimizer

    if int(getattr(engine, "stage_id", 0)) != fault.stage:
        return

    def scale(opt: Any, _args: Any, _kwargs: Any) -> None:
        if engine.global_steps + 1 != fault.step:
            return
        for group in opt.param_groups:
            for t in group["params"]:
                if t.grad is not None:
                    t.grad.mul_(1.0 / gas)
        print(f"parity_inject: stage_scale at step {fault.step}: stage {fault.stage}'s gradient / {gas}", flush=True)

    basic_optimizer(engine).register_step_pre_hook(scale)


def install_norm_doubled(engine: Any, fault: Any) -> None:
    """ZeRO-1/2: the norm the step clips by (and reports) is doubled at ``fault.step``."""
    opt = engine.optimizer
    norm_of = getattr(opt, "scaled_global_norm", None)
    if not callable(norm_of):
        raise SystemExit(f"compare_loss.py: error: norm_doubled needs ZeRO stage 1 or 2 "
                         f"(this engine's optimizer is {type(opt).__name__})")

    def doubled(*args: Any, **kwargs: Any) -> Any:
        norm = norm_of(*args, **kwargs)
        if engine.global_steps + 1 != fault.step:
            return norm
        print(f"parity_inject: norm_doubled at step {fault.step}: the clipping norm x 2", flush=True)
        return norm * 2.0

    opt.scaled_global_norm = doubled
