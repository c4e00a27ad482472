#!/usr/bin/env python
"""Is a loss gap between two conditions bf16 noise or a defect? (issue 37.7: seed 001's z1 vs z2+DeepCompile)

Two conditions that compute the same mathematics in another order (ZeRO-1 vs ZeRO-2, eager vs
compiled) drift apart in bf16 over the steps; how far is a property of the model, the data and the
dtype, and it is measured here, not assumed. The batch holds the pair in question (``--pair z1 z2-dc``)
and an *equivalent* pair of plain eager conditions (``--noise z1 z2``, whose only difference is the
reduction layout), each under several seeds (an axis ``seed: [...]`` in the spec). Per seed s:

    gap(s)   = loss(z2-dc, s, step) - loss(z1, s, step)
    noise(s) = loss(z2,    s, step) - loss(z1, s, step)

The noise band is the largest |noise| over seeds and steps 1..step (a bound every equivalent pair stayed
within). The answer: **noise** when every |gap(s)| at the step lies inside the band, **beyond the noise
band** when one lies outside it by more than the band again (2x), else **undecided: more seeds**. The
interval is the 95% t-interval of the mean gap over seeds (n-1 degrees of freedom; none with one seed).
"Beyond the noise band" is not "a bug": the band is the reduction order's noise only, and a compiled
condition also rounds its fused kernels its own way; the words say how many seeds lie beyond it and
whether the mean's interval holds 0, and claim no more.

    python benchmarks/gpu/loss_gap.py RUNS/gap-YYYYmmdd-HHMMSS --pair z1 z2-dc --noise z1 z2 --step 10

Reads the run folders only (metrics.jsonl, status.json); prints markdown and ``--json`` writes numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from summarize import load  # noqa: E402  (the run folder reader of the GPU scripts)


def losses(batch: Path) -> dict[tuple[str, int], dict[int, float]]:
    """(condition, seed) -> {step: loss} of every run of the batch that logged steps."""
    out: dict[tuple[str, int], dict[int, float]] = {}
    for run in sorted(p for p in batch.iterdir() if (p / "metrics.jsonl").is_file()):
        r = load(run)
        steps = {int(s["step"]): float(s["loss"]) for s in r["steps"] if isinstance(s.get("loss"), (int, float))}
        seed = (r["header"].get("config") or {}).get("seed")
        condition = r["status"].get("condition") or run.name.rsplit("-r", 1)[0]
        condition = "-".join(p for p in condition.split("-") if not p.startswith("seed"))
        if seed is not None and steps:
            out[(condition, int(seed))] = steps
    return out


def t95(n: int) -> float:
    """Two-sided 95% quantile of Student's t with n-1 degrees of freedom (scipy when there)."""
    try:
        from scipy import stats

        return float(stats.t.ppf(0.975, n - 1))
    except ImportError:
        return {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571}.get(n, 2.0)


def judge(data: dict[tuple[str, int], dict[int, float]], pair: tuple[str, str], noise: tuple[str, str],
          step: int) -> dict[str, Any]:
    seeds = sorted({s for (c, s) in data if c == pair[0]} & {s for (c, s) in data if c == pair[1]})
    gaps = {s: data[(pair[1], s)][step] - data[(pair[0], s)][step] for s in seeds
            if step in data[(pair[1], s)] and step in data[(pair[0], s)]}
    band = 0.0
    for s in sorted({s for (c, s) in data if c == noise[0]} & {s for (c, s) in data if c == noise[1]}):
        a, b = data[(noise[0], s)], data[(noise[1], s)]
        band = max([band, *(abs(b[k] - a[k]) for k in a if k in b and k <= step)])
    out: dict[str, Any] = {"step": step, "pair": pair, "noise_pair": noise, "gaps": gaps, "noise_band": band}
    if not gaps:
        return {**out, "answer": "no data", "interval": None}
    values = list(gaps.values())
    mean = statistics.fmean(values)
    interval = None
    if len(values) > 1:
        half = t95(len(values)) * statistics.stdev(values) / math.sqrt(len(values))
        interval = (mean - half, mean + half)
    worst = max(abs(v) for v in values)
    beyond = sum(abs(v) > 2 * band for v in values)
    holds_zero = interval is None or interval[0] <= 0 <= interval[1]
    answer = ("noise" if worst <= band else "undecided: more seeds" if not beyond else
              f"beyond the noise band on {beyond} of {len(values)} seeds (more than 2x the band); the mean gap's "
              f"interval {'holds' if holds_zero else 'excludes'} 0")
    return {**out, "mean_gap": mean, "interval": interval, "largest_gap": worst, "answer": answer}


def markdown(r: dict[str, Any]) -> str:
    p, n = r["pair"], r["noise_pair"]
    lines = [f"| seed | {p[1]} - {p[0]} at step {r['step']} |", "|---|---|"]
    lines += [f"| {s} | {g:+.4f} |" for s, g in sorted(r["gaps"].items())]
    iv = r.get("interval")
    lines += ["", f"Noise band ({n[1]} vs {n[0]}, equivalent eager conditions, every seed, steps 1-{r['step']}): "
              f"|d| <= {r['noise_band']:.4f}."]
    if "mean_gap" in r:
        lines.append(f"Mean gap {r['mean_gap']:+.4f}" + (f", 95% interval [{iv[0]:+.4f}, {iv[1]:+.4f}]" if iv else
                                                         " (one seed: no interval)")
                     + f"; largest |gap| {r['largest_gap']:.4f}.")
    lines.append(f"**Answer: {r['answer']}.**")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("batch", type=Path)
    ap.add_argument("--pair", nargs=2, default=["z1", "z2-dc"])
    ap.add_argument("--noise", nargs=2, default=["z1", "z2"])
    ap.add_argument("--step", type=int, default=10)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    result = judge(losses(a.batch), tuple(a.pair), tuple(a.noise), a.step)
    if a.json:
        a.json.write_text(json.dumps(result, indent=1, default=list))
    print(markdown(result))
    return 0 if result["answer"] != "no data" else 1


if __name__ == "__main__":
    sys.exit(main())
