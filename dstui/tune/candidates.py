"""The search space as candidates: every combination, the global batch kept, each one left out said why.

A candidate is a condition of the spec's ``settings`` with the tuned choices
laid over them. Gradient accumulation is derived (global batch / (micro batch x
data-parallel ranks)), so every candidate trains the same tokens per step. A
combination DeepSpeed cannot run (offload without ZeRO, parameter offload
below ZeRO-3, DeepCompile without CUDA, a degree that does not divide the
ranks, what the runner refuses with sequence parallelism), one whose accumulation would not be whole, and one whose
memory forecast exceeds the GPU are kept in the list with the reason, so the
output says what was never tried and why.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from dstui.analysis import forecast
from dstui.analysis.forecast_model import GIB
from dstui.core.errors import SpecError
from dstui.spec import ulysses_rules
from dstui.spec.experiment import ExperimentSpec
from dstui.spec.settings import Settings
from dstui.spec.tune_block import TuneOptions

OFFLOAD = {"none": {"offload": "none", "offload_params": "none"},
           "optimizer": {"offload": "cpu", "offload_params": "none"},
           "params": {"offload": "cpu", "offload_params": "cpu"}}  # fmt: skip


@dataclass
class Candidate:
    """One configuration of the space; ``pruned`` says why it is not probed (None: it is a candidate)."""

    name: str
    choice: dict[str, Any]
    settings: Settings | None = None
    pruned: str | None = None
    memory: int | None = None  # forecast peak bytes per GPU
    memory_source: str = ""
    order: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def open(self) -> bool:
        return self.pruned is None


def base_settings(spec: ExperimentSpec, *, file: str | None = None) -> Settings:
    try:
        return Settings.model_validate(spec.settings)
    except ValidationError as e:
        from dstui.spec.messages import raise_validation

        raise_validation(e, file=file, condition=None, model=Settings)
        raise  # unreachable: raise_validation raises


def options(spec: ExperimentSpec, *, file: str | None = None) -> TuneOptions:
    if spec.tune is None:
        raise SpecError("no 'tune:' block: `dstui tune` needs the space to search (docs: README, 'Tuning')",
                        file=file, field="tune")  # fmt: skip
    return spec.tune


def global_batch(base: Settings, opts: TuneOptions, *, file: str | None = None) -> int:
    """Samples per optimizer step over all ranks: the tune block's, else what the settings train."""
    if opts.global_batch:
        return opts.global_batch
    if opts.tokens_per_step:
        if opts.tokens_per_step % base.seq_length:
            raise SpecError(f"tokens_per_step {opts.tokens_per_step} is not a multiple of seq_length {base.seq_length}",
                            file=file, field="tune.tokens_per_step")  # fmt: skip
        return opts.tokens_per_step // base.seq_length
    dp = max(1, base.gpus * base.nodes // max(1, base.sequence_parallel))
    return base.micro_batch * base.grad_accum * dp


def sp_degrees(base: Settings, opts: TuneOptions) -> list[int]:
    """The space's Ulysses degrees; unset: 1 and every degree that divides ranks, heads, KV heads and the sequence."""
    if opts.space.sequence_parallel is not None:
        return list(opts.space.sequence_parallel)
    shape = forecast.forecastable_shape(base)
    ranks = base.gpus * base.nodes
    if shape is None:
        return [1]
    fits = [d for d in range(2, ranks + 1)
            if ranks % d == 0 and shape.heads % d == 0 and shape.kv_heads % d == 0 and base.seq_length % d == 0]  # fmt: skip
    return [1, *fits]


def name_of(choice: dict[str, Any]) -> str:
    """'z2-mb4-ga2', 'z3-offparams-mb1-ga8-ac-dc-sp2': the choices that differ from plain."""
    parts = [f"z{choice['zero_stage']}"]
    if choice["offload_kind"] != "none":
        parts.append(f"off{choice['offload_kind']}")
    parts.append(f"mb{choice['micro_batch']}")
    if choice.get("grad_accum"):
        parts.append(f"ga{choice['grad_accum']}")
    parts += [flag for flag, on in (("ac", choice["activation_checkpointing"]), ("dc", choice["deepcompile"])) if on]
    if choice["sequence_parallel"] > 1:
        parts.append(f"sp{choice['sequence_parallel']}")
    return "-".join(parts)


def _combinations(base: Settings, opts: TuneOptions, cuda: bool) -> Iterator[dict[str, Any]]:
    space = opts.space
    dc = space.deepcompile if space.deepcompile is not None else ([False, True] if cuda else [False])
    for z, off, mb, ac, d, sp in itertools.product(
        space.zero_stage, space.offload, space.micro_batch, space.activation_checkpointing, dc, sp_degrees(base, opts)
    ):
        yield {"zero_stage": z, "offload_kind": off, "micro_batch": mb, "activation_checkpointing": ac,
               "deepcompile": d, "sequence_parallel": sp}  # fmt: skip


def invalid(choice: dict[str, Any], base: Settings, cuda: bool) -> str | None:
    """Why DeepSpeed (or this machine) cannot run the combination at all; None if it can."""
    z, off, sp = choice["zero_stage"], choice["offload_kind"], choice["sequence_parallel"]
    ranks = base.gpus * base.nodes
    if off == "optimizer" and z == 0:
        return "optimizer offload needs ZeRO 1-3"
    if off == "params" and z != 3:
        return "parameter offload needs ZeRO-3"
    if choice["deepcompile"] and not cuda:
        return "DeepCompile needs a CUDA GPU; this machine has none"
    if sp > 1 and ranks % sp:
        return f"sequence_parallel {sp} does not divide the {ranks} ranks"
    return None


def build(
    spec: ExperimentSpec, *, cuda: bool, capacity: int | None, file: str | None = None, fit: Any = None
) -> list[Candidate]:
    """Every combination of the space, in a stable order, with its settings, forecast and (if any) why it is out.

    ``fit``: the memory forecast's activation fit on earlier GPU runs (:func:`dstui.analysis.forecast.stored_fit`).
    """
    opts = options(spec, file=file)
    base = base_settings(spec, file=file)
    if base.kind != "train":
        raise SpecError("`dstui tune` tunes the bundled trainer (kind: train)", file=file, field="settings.kind")
    batch = global_batch(base, opts, file=file)
    out: list[Candidate] = []
    ranks = base.gpus * base.nodes
    for i, choice in enumerate(_combinations(base, opts, cuda)):
        sp, mb = choice["sequence_parallel"], choice["micro_batch"]
        dp = ranks // sp if ranks % sp == 0 else 0
        if dp and batch % (mb * dp) == 0:
            choice["grad_accum"] = batch // (mb * dp)
        reason = invalid(choice, base, cuda)
        if reason is None and "grad_accum" not in choice:
            reason = f"global batch {batch} is not a multiple of micro batch {mb} x {dp} data-parallel ranks"
        cand = Candidate(name_of(choice), choice, pruned=reason, order=i)
        if reason is None:
            _settle(cand, base, capacity, fit)
        out.append(cand)
    return out


def overrides(choice: dict[str, Any]) -> dict[str, Any]:
    """The condition's settings: the choice in the spec's own words."""
    out = {k: choice[k] for k in ("zero_stage", "micro_batch", "grad_accum", "activation_checkpointing",
                                  "deepcompile", "sequence_parallel")}  # fmt: skip
    return {**out, **OFFLOAD[choice["offload_kind"]]}


def _settle(cand: Candidate, base: Settings, capacity: int | None, fit: Any = None) -> None:
    """Settings (DeepSpeed's own rules via the model) and the memory forecast against the GPU."""
    try:
        cand.settings = Settings.model_validate({**base.model_dump(exclude_unset=True), **overrides(cand.choice)})
    except ValidationError as e:
        cand.pruned = str(e.errors()[0].get("msg", "invalid settings")).removeprefix("Value error, ")
        return
    refused = ulysses_rules.refusal(cand.settings)  # what the runner cannot run with sequence parallelism
    if refused:
        cand.pruned = f"{refused[0]}: {refused[1]}"
        return
    refit(cand, capacity, fit)


def refit(cand: Candidate, capacity: int | None, fit: Any = None) -> bool:
    """The candidate's memory forecast (with ``fit``, what GPU runs measured); True when it now cannot fit."""
    fc = forecast.forecast(cand.settings, fit=fit) if cand.settings is not None else None
    if fc is not None:
        cand.memory, cand.memory_source = fc.total, fc.source
    reason = forecast.oom_reason(fc, capacity)
    if reason:
        cand.pruned = reason.removeprefix("skipped: ")
    return bool(reason)


def memory_label(cand: Candidate) -> str:
    return "-" if cand.memory is None else f"{cand.memory / GIB:.1f} GiB"
