"""The spec's ``tune:`` block: the search space and the limits of `dstui tune`.

A spec's ``settings`` give the model, data, sequence length, dtype and ranks;
``tune`` says which DeepSpeed set-ups to try on them and how much a search may
cost. The global batch stays fixed across candidates (gradient accumulation is
derived from each micro batch), so every candidate trains the same tokens per
optimizer step and their step times compare directly. Errors name the field
(``tune.space.zero_stage``), as every other part of a spec does.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from dstui.spec import messages
from dstui.spec.settings import ZERO_STAGES, StrictModel

#: how the optimizer state and the parameters live: on the GPU, the optimizer on the host
#: (``offload: cpu``), or parameters too (``offload_params: cpu``, ZeRO-3 only)
OffloadChoice = Literal["none", "optimizer", "params"]


def _distinct(values: list) -> list:
    if not values:
        raise ValueError("needs at least one value")
    if len(set(values)) != len(values):
        raise ValueError(f"a value is listed twice: {values}")
    return values


class TuneSpace(StrictModel):
    """What the search may choose; every combination is a candidate (invalid ones are listed, with why)."""

    zero_stage: list[int] = Field(default_factory=lambda: [0, 1, 2, 3], description="ZeRO stages to try.")
    offload: list[OffloadChoice] = Field(
        default_factory=lambda: ["none", "optimizer", "params"],
        description="none; optimizer: optimizer state on the host (ZeRO >= 1); params: parameters too (ZeRO-3).",
    )
    micro_batch: list[int] = Field(
        default_factory=lambda: [1, 2, 4, 8],
        description="Micro batches per rank; gradient accumulation is derived to keep the global batch.",
    )
    activation_checkpointing: list[bool] = Field(
        default_factory=lambda: [False, True], description="Recompute activations in backward (less memory, more time)."
    )
    deepcompile: list[bool] | None = Field(
        None, description="DeepCompile on/off; unset: both where this machine has CUDA, off elsewhere."
    )
    sequence_parallel: list[int] | None = Field(
        None,
        description="Ulysses degrees; unset: 1 and every degree that divides the ranks, the heads and the "
        "sequence length.",
    )

    _distinct_lists = field_validator(
        "zero_stage", "offload", "micro_batch", "activation_checkpointing", "deepcompile", "sequence_parallel"
    )(classmethod(lambda cls, v: v if v is None else _distinct(v)))

    @field_validator("zero_stage")
    @classmethod
    def _stages(cls, v: list[int]) -> list[int]:
        bad = [s for s in v if s not in ZERO_STAGES]
        if bad:
            raise ValueError(messages.one_of(ZERO_STAGES, bad[0]))
        return v

    @field_validator("micro_batch", "sequence_parallel")
    @classmethod
    def _positive(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(x < 1 for x in v):
            raise ValueError(f"every value must be at least 1 (got {min(v)})")
        return v


class TuneOptions(StrictModel):
    """How `dstui tune` searches: the space, the batch every candidate keeps, and what a search may cost."""

    space: TuneSpace = Field(default_factory=TuneSpace, description="The choices to search.")
    global_batch: int | None = Field(
        None, ge=1,
        description="Samples per optimizer step over all ranks; unset: micro_batch x grad_accum x data-parallel "
        "ranks of the spec's settings.",
    )  # fmt: skip
    tokens_per_step: int | None = Field(
        None, ge=1, description="Or tokens per optimizer step (global_batch = this / seq_length)."
    )
    budget_s: float = Field(1800.0, gt=0, description="Wall time the probes may take together (seconds).")
    probe_time_box_s: float = Field(
        300.0, gt=0, description="Hard limit per probe, launch to exit: a probe past it is stopped (a hang costs no more)."
    )
    probe_steps: int = Field(40, ge=3, description="Most optimizer steps a probe runs; it stops earlier once ranked.")
    warmup_steps: int = Field(2, ge=0, description="Leading steps of a probe left out of its step time.")
    min_steps: int = Field(3, ge=2, description="Timed steps a probe needs before it may stop.")
    precision: float = Field(
        0.03, gt=0, lt=1,
        description="A probe stops once its step time's 95% interval is within this fraction of its mean.",
    )  # fmt: skip
    margin: float = Field(
        0.02, ge=0, lt=1,
        description="A candidate is worth a probe only if it may beat the best measured step time by more than "
        "this fraction (or the best's own noise, when larger).",
    )
    confidence: float = Field(
        0.9, gt=0.5, lt=1,
        description="How sure the time model must be that no candidate left can win before the search stops (one "
        "statement for all of them: each is judged at (1 - confidence) / candidates left).",
    )
    max_probes: int | None = Field(None, ge=1, description="Most probes a search launches (unset: no limit but the budget).")
    history: bool = Field(True, description="Calibrate the time model on earlier runs of this machine in MLflow.")

    @model_validator(mode="after")
    def _coherent(self) -> TuneOptions:
        if self.global_batch is not None and self.tokens_per_step is not None:
            raise ValueError("give global_batch or tokens_per_step, not both")
        if self.probe_steps < self.warmup_steps + self.min_steps:
            raise ValueError(
                f"probe_steps ({self.probe_steps}) must be at least warmup_steps + min_steps "
                f"({self.warmup_steps} + {self.min_steps})"
            )
        return self
