"""A search's outcome as one document: ranking, what was left out and why, the cost, the winner's spec.

The same document is what ``dstui tune --json`` prints, the ``tune.json``
artifact of the batch's MLflow parent, and what the report section "Tuning"
reads back (:mod:`dstui.analysis.tuning`). Times in seconds per optimizer
step, memory in bytes.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Sequence
from typing import Any

from dstui.analysis.time_fit import Prediction, TimeModel
from dstui.spec.experiment import ExperimentSpec
from dstui.tune import search
from dstui.tune.candidates import Candidate, overrides
from dstui.tune.state import Probe, TuneState


def best_probe(st: TuneState) -> Probe | None:
    """The probe with the lowest usable mean step time."""
    usable = [p for p in st.probes if p.usable]
    return min(usable, key=lambda p: p.step_time or 0.0) if usable else None


def error_pct(p: Probe) -> float | None:
    if p.predicted_s is None or not p.step_time:
        return None
    return 100 * (p.predicted_s - p.step_time) / p.step_time


def ranking(st: TuneState, candidates: Sequence[Candidate]) -> list[dict[str, Any]]:
    """Every probe, fastest usable first; each with its prediction, measurement and why it ended."""
    by_name = {c.name: c for c in candidates}
    best = best_probe(st)
    rows = []
    for p in sorted(st.probes, key=lambda p: (not p.usable, p.step_time or 0.0)):
        c = by_name.get(p.candidate)
        ties = best is not None and p.usable and p is not best and p.step_time is not None and best.half is not None \
            and p.half is not None and p.step_time - p.half <= best.step_time + best.half  # fmt: skip
        rows.append({
            "candidate": p.candidate, "run": p.run, "settings": overrides(c.choice) if c else {},
            "predicted_s": p.predicted_s, "predicted_log_sd": p.predicted_sd,
            "measured_s": p.step_time, "measured_half_s": p.half, "timed_steps": p.steps,
            "tokens_per_s": p.tokens_per_s, "mem_peak": p.mem_peak, "forecast_mem": c.memory if c else None,
            "error_pct": error_pct(p), "state": p.state, "outcome": p.outcome, "reason": p.reason,
            "wall_s": p.wall_s, "winner": p is best, "within_noise_of_winner": bool(ties),
            "mlflow_run_id": p.mlflow_run_id,
        })  # fmt: skip
    return rows


def left_out(candidates: Sequence[Candidate]) -> list[dict[str, Any]]:
    """Candidates never probed because they cannot run or fit, with the reason."""
    return [{"candidate": c.name, "reason": c.pruned, "forecast_mem": c.memory} for c in candidates if c.pruned]


def not_probed(st: TuneState, candidates: Sequence[Candidate], model: TimeModel | None, confidence: float) -> list[dict[str, Any]]:
    """Open candidates the search did not need: their prediction and its optimistic end."""
    from dstui.analysis.forecast import forecastable_shape
    from dstui.analysis.time_model import terms

    probed = {p.candidate for p in st.probes}
    left = [c for c in candidates if c.open and c.name not in probed and c.settings is not None]
    z = search.joint_z(confidence, len(left))  # the level the search stopped at
    out = []
    for c in left:
        if model is None:
            continue
        shape = forecastable_shape(c.settings)
        pred: Prediction | None = model.predict(terms(c.settings, shape, model.hardware)) if shape else None
        out.append({"candidate": c.name, "predicted_s": pred.seconds if pred else None,
                    "optimistic_s": pred.bound(z) if pred else None, "forecast_mem": c.memory})  # fmt: skip
    return sorted(out, key=lambda r: r["predicted_s"] or 0.0)


def cost(st: TuneState, ranks: int, on_gpu: bool, budget_s: float) -> dict[str, Any]:
    """What the search itself cost: probes, their wall time (launch to exit), GPU time, the tuner's own wall."""
    wall = sum(p.wall_s for p in st.probes)
    return {
        "probes": len(st.probes), "probe_wall_s": wall, "gpu_s": wall * ranks if on_gpu else 0.0,
        "search_wall_s": st.search_s, "budget_s": budget_s,
        "median_probe_s": statistics.median([p.wall_s for p in st.probes]) if st.probes else None,
    }  # fmt: skip


def winner_spec(spec: ExperimentSpec, winner: Candidate) -> dict[str, Any]:
    """The spec to `dstui run`: the spec's settings with the winner's choices, no tune block, no axes."""
    data = spec.model_dump(mode="json", exclude_defaults=True)
    out: dict[str, Any] = {"name": f"{spec.name}-tuned"}
    out["description"] = f"The fastest configuration `dstui tune` found for {spec.name}: {winner.name}."
    out["settings"] = {**copy.deepcopy(data.get("settings", {})), **overrides(winner.choice)}
    for key in ("revisions", "executor", "slurm", "gpu_memory_gib"):
        if key in data:
            out[key] = data[key]
    return out


def document(
    st: TuneState, spec: ExperimentSpec, candidates: Sequence[Candidate], model: TimeModel | None, *,
    ranks: int, on_gpu: bool, folder: str,
) -> dict[str, Any]:  # fmt: skip
    """The whole outcome (see the module's text)."""
    opts = spec.tune
    assert opts is not None
    best = best_probe(st)
    return {
        "experiment": spec.name, "spec": st.spec_path, "folder": folder, "batch": st.batch,
        "status": st.status, "stop_reason": st.stop_reason, "winner": best.candidate if best else None,
        "machine": model.hardware.kind if model else None,
        "candidates": len(candidates), "open": sum(1 for c in candidates if c.open),
        "ranking": ranking(st, candidates), "left_out": left_out(candidates),
        "not_probed": not_probed(st, candidates, model, opts.confidence),
        "cost": cost(st, ranks, on_gpu, opts.budget_s),
        "model": {"source": model.source, "model_sd": model.model_sd, "factors": model.factors()} if model else None,
        "options": opts.model_dump(mode="json"),
    }  # fmt: skip
