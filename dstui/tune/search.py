"""Which candidate to probe next, and when to stop: pure functions of predictions and measurements.

A candidate *can still win* when the optimistic end of its predicted step time
(``confidence`` one-sided: ``prediction x exp(-z sd)``) is below the best measured
mean by more than the margin (the larger of the spec's ``margin`` and the best's
own relative noise). Among those, the one predicted fastest is probed next (ties
in the spec's order). The search stops when none can still win, when the budget
cannot pay for another probe, or when the probe count is reached.

An out-of-memory probe teaches the memory side: every candidate that needs at
least as much memory as it did (same ZeRO set-up and Ulysses degree, no less
micro batch, checkpointing not added, no more offload) is left out, and the forecasts
of the rest are scaled by how far the failed one's forecast was below the GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from dstui.analysis.forecast_model import GIB
from dstui.analysis.time_fit import Prediction
from dstui.tune.candidates import Candidate
from dstui.tune.probe_rules import StepTime

OFFLOAD_RANK = {"none": 0, "optimizer": 1, "params": 2}


@dataclass(frozen=True)
class Best:
    name: str
    time: StepTime


@dataclass(frozen=True)
class Decision:
    """The next candidate (None: stop) and why, in words a report can print."""

    candidate: str | None
    why: str


def z_of(confidence: float) -> float:
    return NormalDist().inv_cdf(confidence)


def joint_z(confidence: float, left: int) -> float:
    """The one-sided z at which ``left`` candidates are judged together (Bonferroni)."""
    return z_of(1 - (1 - confidence) / max(1, left))


def margin_of(best: Best, margin: float) -> float:
    """How much faster than the best a candidate must be able to be: the spec's margin or the best's noise."""
    noise = best.time.rel_half if best.time.rel_half != float("inf") else 0.0
    return max(margin, noise)


def can_win(pred: Prediction, best: Best | None, *, z: float, margin: float) -> bool:
    return best is None or pred.bound(z) < best.time.mean * (1 - margin_of(best, margin))


def decide(
    candidates: Sequence[Candidate],
    predictions: dict[str, Prediction],
    best: Best | None,
    *,
    confidence: float,
    margin: float,
) -> Decision:
    """The open candidate predicted fastest among those that can still win; or stop, saying why.

    "No remaining candidate can win" is said of all of them at once: the one-sided level is
    split among the candidates left (Bonferroni), so a large space is not left out at 10% a
    candidate.
    """
    open_ = [c for c in candidates if c.open and c.name in predictions]
    if not open_:
        return Decision(None, "every candidate was probed or left out")
    z = joint_z(confidence, len(open_))
    contenders = [c for c in open_ if can_win(predictions[c.name], best, z=z, margin=margin)]
    if not contenders:
        assert best is not None
        m = margin_of(best, margin)
        return Decision(None, f"no remaining candidate can beat {best.name} ({best.time.mean * 1e3:.4g} ms/step) "
                              f"by {m:.1%} at {confidence:.0%} confidence ({len(open_)} left unprobed)")  # fmt: skip
    pick = min(contenders, key=lambda c: (predictions[c.name].seconds, c.order))
    p = predictions[pick.name]
    lo, hi = p.interval(z)
    return Decision(pick.name, f"predicted {p.label()} [{lo * 1e3:.4g}, {hi * 1e3:.4g}] ms, the fastest of "
                               f"{len(contenders)} that can still win")  # fmt: skip


def dominates(oomed: Candidate, other: Candidate) -> bool:
    """``other`` needs at least the memory ``oomed`` needed: same set-up, no smaller batch, no more relief."""
    a, b = oomed.choice, other.choice
    same = all(a[k] == b[k] for k in ("zero_stage", "deepcompile", "sequence_parallel"))
    return (same and b["micro_batch"] >= a["micro_batch"] and OFFLOAD_RANK[b["offload_kind"]] <= OFFLOAD_RANK[a["offload_kind"]]
            and (a["activation_checkpointing"] or not b["activation_checkpointing"]))  # fmt: skip


def teach_oom(candidates: Sequence[Candidate], oomed: Candidate, capacity: int | None) -> list[str]:
    """Leave out what cannot fit after ``oomed`` ran out of memory; returns the names newly left out."""
    out = []
    factor = capacity / oomed.memory if capacity and oomed.memory and oomed.memory < capacity else 1.0
    for c in candidates:
        if not c.open or c is oomed:
            continue
        if dominates(oomed, c):
            c.pruned = f"needs at least the memory of {oomed.name}, which ran out of memory"
        elif c.memory and capacity and c.memory * factor > capacity:
            c.pruned = (f"predicted OOM after {oomed.name} ran out of memory: forecast {c.memory / GIB:.1f} GiB x "
                        f"{factor:.2f} > {capacity / GIB:.1f} GiB")  # fmt: skip
        else:
            continue
        out.append(c.name)
    return out
