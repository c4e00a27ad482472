#!/usr/bin/env python
"""How many probes `dstui tune`'s search spends, and how close its winner comes, on simulated machines.

A GPU run of the whole question costs a device call (benchmarks/gpu/validate.sh tune); this runs the
search's own code (candidates, time model, :func:`dstui.tune.search.decide`) against many machines
whose true step times are known, to see its behaviour over the space of what a machine can be:

* each term of the time model (compute, small batch, launch, ZeRO-3 fetches, communication, ...) is
  off from the first-principles prior by a random factor ``exp(N(0, --factor-sd))``: the machine is
  not the data sheet;
* each candidate's true time is further off by ``exp(N(0, --config-sd))``: what no term describes;
* a probe measures the true time with ``--noise`` relative noise (its interval half-width 2x that).

No history: every search starts from the prior, as on a fresh machine. Prints, per space, the
probes spent (median, worst) against the candidates, and the winner's true step time against the
true best (median, worst; share within 3%).

    python benchmarks/tune_simulated.py --seeds 200
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dstui.analysis.forecast import forecastable_shape  # noqa: E402
from dstui.analysis.time_fit import Observation, TimeModel  # noqa: E402
from dstui.analysis.time_model import TERMS, gpu_hardware, terms  # noqa: E402
from dstui.spec.loading import parse_spec  # noqa: E402
from dstui.tune import candidates as cands_mod  # noqa: E402
from dstui.tune import probe_rules, search  # noqa: E402

GPU = "NVIDIA H100 80GB HBM3"
CAPACITY = 80 * 2**30
SPACES = {
    "1 GPU: llama-1b, ZeRO 1-3 x mb 1/2/4 (benchmarks/gpu/tune1.yaml)": {
        "settings": {"model": "llama-1b", "seq_length": 2048, "dtype": "bf16", "gpus": 1},
        "tune": {"global_batch": 8, "margin": 0.03, "space": {"zero_stage": [1, 2, 3], "offload": ["none"],
                 "micro_batch": [1, 2, 4], "activation_checkpointing": [False], "deepcompile": [False],
                 "sequence_parallel": [1]}}},
    "8 GPUs: llama-1b, ZeRO 0-3 x offload x mb 1/2/4/8 x checkpointing": {
        "settings": {"model": "llama-1b", "seq_length": 2048, "dtype": "bf16", "gpus": 8},
        "tune": {"global_batch": 64, "margin": 0.03, "space": {"zero_stage": [0, 1, 2, 3],
                 "offload": ["none", "optimizer", "params"], "micro_batch": [1, 2, 4, 8],
                 "activation_checkpointing": [False, True], "deepcompile": [False], "sequence_parallel": [1]}}},
}  # fmt: skip


def one_search(spec, rng: random.Random, a: argparse.Namespace) -> tuple[int, int, float]:
    """(probes, candidates, winner's true time / true best) for one simulated machine."""
    hw = gpu_hardware(GPU)
    cands = [c for c in cands_mod.build(spec, cuda=True, capacity=CAPACITY) if c.open]
    factor = {t: math.exp(rng.gauss(0, a.factor_sd)) for t in TERMS}
    t_of = {c.name: terms(c.settings, forecastable_shape(c.settings), hw) for c in cands}
    true = {n: sum(factor[k] * v for k, v in t.items()) * math.exp(rng.gauss(0, a.config_sd)) for n, t in t_of.items()}
    opts = spec.tune
    measured: dict[str, float] = {}
    observations: list[Observation] = []
    while True:
        model = TimeModel(hw, observations).fit()
        preds = {n: model.predict(t) for n, t in t_of.items() if n not in measured}
        best = min(measured, key=measured.get) if measured else None
        top = search.Best(best, probe_rules.StepTime(measured[best], 2 * a.noise * measured[best], 20)) if best else None
        times = {n: probe_rules.StepTime(m, 2 * a.noise * m, 20) for n, m in measured.items()}
        decision = search.decide(cands, preds, top, confidence=opts.confidence, margin=opts.margin, measured=times,
                                 capacity=CAPACITY)
        if decision.candidate is None:
            break
        name = decision.candidate
        measured[name] = true[name] * math.exp(rng.gauss(0, a.noise))
        observations.append(Observation(t_of[name], measured[name], a.noise))
    winner = min(measured, key=measured.get)
    return len(measured), len(cands), true[winner] / min(true.values())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=100)
    p.add_argument("--factor-sd", type=float, default=0.6, help="log sd of each term's truth against the prior")
    p.add_argument("--config-sd", type=float, default=0.05, help="log sd of what no term describes, per candidate")
    p.add_argument("--noise", type=float, default=0.01, help="relative noise of a probe's mean step time")
    a = p.parse_args()
    print(f"{a.seeds} machines per space; term factors exp(N(0, {a.factor_sd})), unexplained exp(N(0, {a.config_sd})), "
          f"probe noise {a.noise:.0%}")  # fmt: skip
    print("| space | candidates | probes: median (worst) | winner / true best: median (worst) | within 3% |")
    print("|---|---|---|---|---|")
    for title, data in SPACES.items():
        spec = parse_spec({"name": "sim", **data})
        runs = [one_search(spec, random.Random(seed), a) for seed in range(a.seeds)]
        probes, ratios = [r[0] for r in runs], [r[2] for r in runs]
        within = sum(r <= 1.03 for r in ratios) / len(ratios)
        print(f"| {title} | {runs[0][1]} | {statistics.median(probes):.0f} ({max(probes)}) | "
              f"{statistics.median(ratios):.3f} ({max(ratios):.3f}) | {within:.0%} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
