"""Seed 004's grids (model x micro batch per ZeRO/offload level) and the speed/memory Pareto front."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dstui.analysis.rundata import FAILED_STATES, GB, RunData, parse_value
from dstui.analysis.stats import ConditionStats, finite_mean


def level_of(run: RunData) -> str:
    """ZeRO stage plus offload, the 'optimization level' of seed 004's grids."""
    stage = run.param("zero_stage", "?")
    parts = [f"ZeRO-{stage}"]
    off = run.param("offload", "none")
    if off not in (None, "none", False):
        parts.append(f"offload {off}")
    poff = run.param("offload_params", "none")
    if poff not in (None, "none", False):
        parts.append(f"param offload {poff}")
    return " + ".join(parts)


def wants_grid(runs: Sequence[RunData]) -> bool:
    """A grid helps when model or micro_batch is an axis of the experiment.

    That is: within one ZeRO/offload level, two runs share the model but not
    the micro batch, or the micro batch but not the model. A plain ZeRO 1/2/3
    comparison (one model, one micro batch) gets no grid.
    """
    train = [r for r in runs if r.kind != "verify"]
    if not train or not all("model" in r.params and "micro_batch" in r.params for r in train):
        return False
    seen: dict[tuple[str, str], set[str]] = {}
    for r in train:
        level = level_of(r)
        seen.setdefault((level, "m:" + r.params["model"]), set()).add(r.params["micro_batch"])
        seen.setdefault((level, "b:" + r.params["micro_batch"]), set()).add(r.params["model"])
    return any(len(v) > 1 for v in seen.values())


def _sort_key(v: Any) -> tuple[int, Any]:
    pv = parse_value(str(v))
    return (0, pv) if isinstance(pv, (int, float)) else (1, str(pv))


def grids(runs: Sequence[RunData]) -> dict[str, dict[str, Any]]:
    """{'iter_time': {level: DataFrame}, 'mem': {level: DataFrame}} with OOM/FAIL cells.

    A cell is the mean over usable runs of that (level, model, micro_batch);
    when no run of the cell is usable it reads OOM if any failed for lack of
    memory, else FAIL, else '' (not run).
    """
    import pandas as pd

    train = [r for r in runs if r.kind != "verify"]
    models = sorted({r.params["model"] for r in train}, key=_sort_key)
    mbs = sorted({r.params["micro_batch"] for r in train}, key=_sort_key)
    levels: dict[str, list[RunData]] = {}
    for r in train:
        levels.setdefault(level_of(r), []).append(r)
    out: dict[str, dict[str, Any]] = {"iter_time": {}, "mem": {}}
    for level in sorted(levels, key=lambda s: s):
        members = levels[level]
        frames = {
            name: pd.DataFrame("", index=pd.Index(models, name="model"), columns=mbs, dtype=object)
            for name in out
        }
        for model in models:
            for mb in mbs:
                cell = [r for r in members if r.params["model"] == model and r.params["micro_batch"] == mb]
                if not cell:
                    continue
                usable = [r for r in cell if r.usable]
                it = finite_mean(r.stats.get("iter_time_mean") for r in usable)
                mem = finite_mean(r.stats.get("mem_peak_max") for r in usable)
                if usable and (it is not None or mem is not None):
                    frames["iter_time"].loc[model, mb] = round(it, 6) if it is not None else "n/a"
                    frames["mem"].loc[model, mb] = round(mem / GB, 3) if mem is not None else "n/a"
                else:
                    mark = "OOM" if any(r.oom for r in cell) else (
                        "FAIL" if any(r.status in FAILED_STATES for r in cell) else r_state(cell)
                    )
                    frames["iter_time"].loc[model, mb] = mark
                    frames["mem"].loc[model, mb] = mark
        for name, frame in frames.items():
            frame.columns = pd.Index([str(c) for c in mbs], name="micro_batch")
            out[name][level] = frame
    return out


def r_state(cell: Sequence[RunData]) -> str:
    """Marker for a grid cell whose runs have not produced numbers yet."""
    states = {r.status for r in cell}
    return "/".join(sorted(states)) if states else ""


# -- recommendations ----------------------------------------------------------


def pareto(conds: Sequence[ConditionStats], basis: str = "time") -> list[ConditionStats]:
    """Conditions no other condition beats on both speed and peak memory, fastest first.

    Speed is iteration time (lower is better), or tokens/s (higher is better)
    with ``basis="tokens"``: where tokens per step differ, time per step does
    not say which condition is faster (:mod:`dstui.analysis.speed`).
    """

    def cost(c: ConditionStats) -> float | None:  # lower is faster
        if basis == "tokens":
            return -c.tokens_per_s_mean if c.tokens_per_s_mean is not None else None
        return c.iter_time_mean

    pts = [(cost(c), c.mem_peak_max, c) for c in conds]
    pts = [p for p in pts if p[0] is not None and p[1] is not None]
    front = []
    for t, m, c in pts:
        dominated = any(
            o is not c and ot <= t and om <= m and (ot < t or om < m)  # type: ignore[operator]
            for ot, om, o in pts
        )
        if not dominated:
            front.append((t, c))
    return [c for _, c in sorted(front, key=lambda x: x[0])]  # type: ignore[arg-type, return-value]
