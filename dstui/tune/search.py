"""Which candidate to probe next, and when to stop: pure functions of predictions and measurements.

A candidate *can still win* when the optimistic end of its predicted step time
(``confidence`` one-sided: ``prediction x exp(-z sd)``) is below the best measured
mean by more than the margin (the larger of the spec's ``margin`` and the best's
own relative noise). Among those, the one predicted fastest is probed next (ties
in the spec's order). The search stops when none can still win, when the budget
cannot pay for another probe, or when the probe count is reached.

A measured probe also bounds the candidates that do all of its work and more
(:func:`does_more_work`: ZeRO-3 where it ran ZeRO 0-2, activation checkpointing
added, a smaller micro batch (more accumulation steps for the same global batch),
all else equal): none of them can be faster than the low end of its 95%
interval, whatever the time model says. On one H100 the time model's prior for
ZeRO-3 was wide enough ([304, 917] ms) that the search spent a fourth probe on
z3-mb4 after z2-mb4 had measured 404 ms; that probe measured 654 ms. Replayed on
that grid's measurements, the stage order alone still left z3-mb1 open (no
z1/z2-mb1 measured, its prior [360, 3098] ms); the micro-batch order closes it.

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


def can_win(pred: Prediction, best: Best | None, *, z: float, margin: float, floor: float = 0.0) -> bool:
    """``floor``: a step time the candidate cannot beat (:func:`floor_of`), whatever the prediction says."""
    return best is None or max(pred.bound(z), floor) < best.time.mean * (1 - margin_of(best, margin))


HEADROOM = 0.9  # above this share of the GPU, a larger micro batch may pay the allocator's cache flushes


def does_more_work(measured: Candidate, other: Candidate, capacity: int | None = None) -> bool:
    """``other`` does everything ``measured`` did, and more, for the same global batch.

    ZeRO-3 adds a parameter all-gather before every forward and backward (1.5x the
    communication of ZeRO 1/2) and module hooks to ZeRO 0-2's work; activation
    checkpointing adds a forward recompute; a smaller micro batch trains the same
    tokens in more micro steps, each paying the per-step costs again (kernel launches,
    ZeRO-3's gathers, ZeRO-2's reduction, hooks) on smaller matrices that use the device
    no better (on one H100 every stage measured mb4 < mb2 < mb1: 403/468/682 ms at ZeRO-1,
    798/1572/3327 at ZeRO-3). That last order holds only while the larger batch fits with
    room (its forecast under :data:`HEADROOM` of ``capacity``, where a capacity is known):
    near the limit, PyTorch's allocator flushes its cache and the larger batch can lose.
    Offload is not ordered: on a CPU-only box the "offloaded" optimizer is DeepSpeed's CPU
    Adam, which can beat torch's.
    """
    a, b = measured.choice, other.choice
    if any(a[k] != b[k] for k in ("offload_kind", "deepcompile", "sequence_parallel")):
        return False
    roomy = capacity is None or (measured.memory is not None and measured.memory <= HEADROOM * capacity)
    batch_ok = b["micro_batch"] == a["micro_batch"] or (b["micro_batch"] < a["micro_batch"] and roomy)
    stage_ok = b["zero_stage"] == a["zero_stage"] or (b["zero_stage"] == 3 and a["zero_stage"] < 3)
    ckpt_ok = b["activation_checkpointing"] or not a["activation_checkpointing"]
    return batch_ok and stage_ok and ckpt_ok and a != b


def floor_of(cand: Candidate, candidates: Sequence[Candidate], measured: dict[str, StepTime],
             capacity: int | None = None) -> tuple[float, str]:  # fmt: skip
    """(the fastest step time ``cand`` could have given what was measured, the probe that says so) or (0, "")."""
    floors = [(measured[c.name].low, c.name) for c in candidates
              if c.name in measured and measured[c.name].steps >= 2 and does_more_work(c, cand, capacity)]  # fmt: skip
    return max(floors, default=(0.0, ""))


def decide(
    candidates: Sequence[Candidate],
    predictions: dict[str, Prediction],
    best: Best | None,
    *,
    confidence: float,
    margin: float,
    measured: dict[str, StepTime] | None = None,
    capacity: int | None = None,
) -> Decision:
    """The open candidate predicted fastest among those that can still win; or stop, saying why.

    "No remaining candidate can win" is said of all of them at once: the one-sided level is
    split among the candidates left (Bonferroni), so a large space is not left out at 10% a
    candidate. ``measured``: the probes' step times, which bound what does more work;
    ``capacity``: the GPU's bytes, None on a CPU-only machine (:func:`does_more_work`).
    """
    open_ = [c for c in candidates if c.open and c.name in predictions]
    if not open_:
        return Decision(None, "every candidate was probed or left out")
    z = joint_z(confidence, len(open_))
    floors = {c.name: floor_of(c, candidates, measured or {}, capacity) for c in open_}
    contenders = [c for c in open_ if can_win(predictions[c.name], best, z=z, margin=margin, floor=floors[c.name][0])]
    if not contenders:
        assert best is not None
        m = margin_of(best, margin)
        # the ones the prediction alone would have probed: bounded by a measured probe they out-work
        by_work = [f"{c.name} (>= {floors[c.name][1]})" for c in open_
                   if floors[c.name][1] and can_win(predictions[c.name], best, z=z, margin=margin)]  # fmt: skip
        more = f"; doing more work than a measured probe: {', '.join(by_work)}" if by_work else ""
        return Decision(None, f"no remaining candidate can beat {best.name} ({best.time.mean * 1e3:.4g} ms/step) "
                              f"by {m:.1%} at {confidence:.0%} confidence ({len(open_)} left unprobed{more})")  # fmt: skip
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
