"""Does verify cry wolf? The installed (good) DeepSpeed against its baseline, many seeds, per dtype (issue 37.6).

Every run is runners/compare_loss.py on two gloo ranks, as ``kind: verify`` starts it, with a
different seed (initial weights and data) and a recipe that cycles through ZeRO 0-3 x grad_accum 1/4
(fp32 ZeRO-3 without the mirrored hooks, so it gets a measured tolerance too). On a correct release
every run must PASS; the *margin* (the largest difference over its tolerance, across loss, every
applied gradient and master tensor and the whole gradient's L2 distance) says how close each came.

    .ci/with-env python benchmarks/verify_self_compare.py --per-dtype 20 --parallel 2

prints a markdown section for docs/BENCHMARKS.md and writes the per-run numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dstui.execute.launch import free_port  # noqa: E402

RECIPES = [(stage, gas) for gas in (1, 4) for stage in (0, 1, 2, 3)]


def ds_config(stage: int, gas: int, dtype: str) -> dict[str, Any]:
    cfg: dict[str, Any] = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": gas,
                           "steps_per_print": 10**9, "gradient_clipping": 0.0, "zero_allow_untested_optimizer": True,
                           "zero_optimization": {"stage": stage}}
    if dtype != "fp32":
        cfg[dtype] = {"enabled": True}
    return cfg


def one(out: Path, dtype: str, seed: int, steps: int) -> dict[str, Any]:
    stage, gas = RECIPES[seed % len(RECIPES)]
    name = f"{dtype}-s{seed}-z{stage}-ga{gas}"
    (out / f"{name}.json").write_text(json.dumps(ds_config(stage, gas, dtype)))
    metrics = out / f"{name}.jsonl"
    metrics.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "dstui.execute.injob.ranks", "--nproc", "2", "--master-port", str(free_port()), "--",
           sys.executable, str(REPO / "runners" / "compare_loss.py"), "--model", "tiny-llama", "--seq-length", "16",
           "--steps", str(steps), "--torch-adam", "--seed", str(seed), "--ds-config", str(out / f"{name}.json"),
           "--metrics-file", str(metrics)]
    env = {k: v for k, v in os.environ.items() if k not in ("DSTUI_PARITY_INJECT", "DSTUI_METRICS_FILE")}
    t0 = time.monotonic()
    with open(out / f"{name}.log", "w") as log:
        code = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    recs = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.exists() else []
    summary = next((r for r in reversed(recs) if r.get("type") == "summary"), {})
    steps_recs = [r for r in recs if r.get("type") == "step"]
    ratios = [r["grad_norm_ratio"] for r in steps_recs if r.get("grad_norm_ratio") is not None]
    return {"name": name, "dtype": dtype, "seed": seed, "zero_stage": stage, "grad_accum": gas, "exit": code,
            "verdict": summary.get("verdict", "error"), "margin": summary.get("margin_max"),
            "tolerance_mode": summary.get("tolerance_mode"), "reason": summary.get("reason"),
            "ratio_min": min(ratios, default=None), "ratio_max": max(ratios, default=None),
            "l2_max": max((r.get("grad_l2_rel_diff") or 0.0 for r in steps_recs), default=None),
            "seconds": round(time.monotonic() - t0, 1)}


def run_all(out: Path, per_dtype: int, parallel: int, steps: int, dtypes: list[str]) -> list[dict[str, Any]]:
    todo = [(d, s) for d in dtypes for s in range(per_dtype)]
    results: list[dict[str, Any]] = []
    lock, slots = threading.Lock(), threading.Semaphore(parallel)

    def work(dtype: str, seed: int) -> None:
        with slots:
            r = one(out, dtype, seed, steps)
        with lock:
            results.append(r)
            print(f"[{len(results)}/{len(todo)}] {r['name']}: {r['verdict']} margin {r['margin']} "
                  f"ratio {r['ratio_min']}..{r['ratio_max']} ({r['seconds']} s)", file=sys.stderr, flush=True)

    threads = [threading.Thread(target=work, args=t) for t in todo]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(results, key=lambda r: (r["dtype"], r["seed"]))


def _q(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]


def markdown(results: list[dict[str, Any]], wall: float, steps: int) -> str:
    lines = ["| dtype | runs | PASS | FAIL | margin: min / median / 90th pct / max | bit-exact runs | "
             "grad-norm ratio: lowest / highest |", "|---|---|---|---|---|---|---|"]
    for dtype in sorted({r["dtype"] for r in results}):
        rs = [r for r in results if r["dtype"] == dtype]
        margins = [r["margin"] for r in rs if r["margin"] is not None]
        ratios = [x for r in rs for x in (r["ratio_min"], r["ratio_max"]) if x is not None]
        spread = (f"{min(margins):.3g} / {statistics.median(margins):.3g} / {_q(margins, 0.9):.3g} / {max(margins):.3g}"
                  if margins else "-")
        lines.append(f"| {dtype} | {len(rs)} | {sum(r['verdict'] == 'PASS' for r in rs)} | "
                     f"{sum(r['verdict'] != 'PASS' for r in rs)} | {spread} | {sum(m == 0 for m in margins)} | "
                     f"{min(ratios):.6f} / {max(ratios):.6f} |")
    fails = [r for r in results if r["verdict"] != "PASS"]
    lines.append("")
    lines.append(f"{len(results)} runs, {steps} steps each, two at a time: {wall / 60:.1f} min of wall time.")
    for r in fails:
        lines.append(f"- {r['name']}: {r['verdict']} (exit {r['exit']}): {r['reason']}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--per-dtype", type=int, default=20, help="runs (seeds 0..N-1) per dtype")
    p.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    p.add_argument("--parallel", type=int, default=2, help="runs at a time (each holds 2 ranks)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "verify_self_compare")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    results = run_all(a.out, a.per_dtype, a.parallel, a.steps, a.dtypes)
    wall = time.monotonic() - t0
    (a.out / "results.json").write_text(json.dumps({"wall_s": wall, "steps": a.steps, "runs": results}, indent=1))
    print(markdown(results, wall, a.steps))
    return 0 if all(r["verdict"] == "PASS" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
