"""Live divergence and NaN guard: flag a run at the step its loss goes wrong.

Pure logic, fed step records by the supervisor as it ingests them. A step is
flagged when its loss is NaN/inf, or when it departs from the baseline
condition's loss at the same step by more than the tolerance, with the rule
``kind: verify`` uses for losses (``torch.allclose``'s): close when
``|loss - base| <= atol + rtol * |base|``; NaN is never close. So the guard
flags the same step at which verify's loss comparison (``loss_within_tol``)
first fails. Only the first flag counts: after it the run has diverged.

Steps are decided in order. When the baseline has not reached a step yet (it
runs beside or after this run), that step and the later ones wait, so the
flag still lands on the first departing step, never on a later one. A NaN
needs no baseline, but waits behind an undecided earlier step for the same
reason. A baseline that ended without the step leaves it unchecked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GuardConfig:
    """What to watch: the baseline condition, the tolerance (None: divergence unchecked), what stops a run."""

    baseline: str | None = None
    rtol: float | None = None
    atol: float | None = None
    stop_on: tuple[str, ...] = ()

    @property
    def checks_divergence(self) -> bool:
        return self.baseline is not None and (self.rtol is not None or self.atol is not None)

    def close(self, loss: float, base: float) -> bool:
        return abs(loss - base) <= (self.atol or 0.0) + (self.rtol or 0.0) * abs(base)


@dataclass(frozen=True)
class Flag:
    """The step a run went wrong at, and how."""

    step: int
    kind: str  # "nan" or "divergence"
    loss: float
    baseline: float | None = None

    @property
    def delta(self) -> float | None:
        return None if self.baseline is None else self.loss - self.baseline

    @property
    def message(self) -> str:
        """``diverged at step N (Δ=…)``, or ``(loss=nan)`` for a non-finite loss."""
        if self.kind == "nan":
            return f"diverged at step {self.step} (loss={self.loss})"
        return f"diverged at step {self.step} (Δ={self.delta:+.4g})"

    def as_dict(self) -> dict[str, object]:
        return {"step": self.step, "kind": self.kind, "loss": _jsonable(self.loss),
                "baseline": self.baseline, "delta": self.delta, "message": self.message}  # fmt: skip


@dataclass
class DivergenceGuard:
    """One run's guard. :meth:`observe` its losses, :meth:`check` against the baseline's."""

    config: GuardConfig
    is_baseline: bool = False
    flag: Flag | None = None
    pending: dict[int, float] = field(default_factory=dict)

    def observe(self, step: int, loss: float | None) -> None:
        """Remember one step's loss (records without a loss are ignored)."""
        if self.flag is None and loss is not None:
            self.pending[int(step)] = float(loss)

    def check(self, baseline: dict[int, float] | None = None, *, baseline_ended: bool = False) -> Flag | None:
        """Decide the pending steps in order; returns the flag when this call raised it."""
        if self.flag is not None:
            return None
        compare = self.config.checks_divergence and not self.is_baseline
        for step in sorted(self.pending):
            loss = self.pending[step]
            base = (baseline or {}).get(step) if compare else None
            if compare and base is None and not baseline_ended:
                return None  # wait for the baseline to reach this step
            del self.pending[step]
            if not math.isfinite(loss):
                self.flag = Flag(step, "nan", loss, base)
            elif base is not None and not self.config.close(loss, base):
                self.flag = Flag(step, "divergence", loss, base)
            if self.flag is not None:
                self.pending.clear()
                return self.flag
        return None

    @property
    def should_stop(self) -> bool:
        return self.flag is not None and self.flag.kind in self.config.stop_on


def _jsonable(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def losses_from_records(records: list[dict]) -> dict[int, float]:
    """step -> loss from metrics.jsonl step records (the baseline run's curve)."""
    return {int(r["step"]): float(r["loss"]) for r in records if r.get("type") == "step" and r.get("loss") is not None}
