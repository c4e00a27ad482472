#!/usr/bin/env python
"""Issue 42 on a GPU: the exhaustive grid vs `dstui tune` vs DeepSpeed's autotuner, side by side.

Reads what benchmarks/gpu/validate.sh's ``tune`` phase left and prints markdown:

* the grid (`dstui run` of the tune space, every candidate): per condition the mean step time after
  warm-up with its 95% interval (the probes' own statistic), tokens/s, wall time launch to exit;
* the search (`dstui tune --json`): winner, probes, their wall and GPU time, why it stopped; the
  winner's tokens/s against the grid's best (goal: within 3%), probes and GPU time against the grid's
  (goal: at most a third);
* the time model after the search (`dstui tune --dry-run --json` again: calibrated on the probes) against
  every grid condition's measured step time: median and worst error, probed conditions marked
  (they were fitted on; the others were predicted);
* the autotuner (``--autotune-dir``: its results and experiment folders): experiments started and
  finished, its wall time, its answer (ds_config_optimal.json), and that answer's step time in the grid.

    python benchmarks/gpu/tune_compare.py --grid-batch RUNS/grid-BATCH --tune tune.json --after plan-after.json \\
        --autotune-dir autotune --autotune-wall 150 --json compare.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from dstui.core.record_file import read_records  # noqa: E402
from dstui.core.rundir import BatchDir  # noqa: E402
from dstui.tune import probe_rules  # noqa: E402


def grid_rows(batch: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for rd in BatchDir(batch).runs():
        st = rd.status()
        recs = read_records(rd.metrics_file)
        steps = [r for r in recs if r.get("type") == "step"]
        warm = int(rd.settings().get("warmup_steps", 0))
        t = probe_rules.step_time([float(r["iter_time"]) for r in steps], warm)
        tokens = steps[0]["tokens_per_s"] * steps[0]["iter_time"] if steps else None
        wall = (st.get("ended") or 0) - (st.get("started") or 0) if st.get("started") else None
        header = next((r for r in recs if r.get("type") == "header"), {})
        on_gpu = header.get("device") == "cuda"
        out[st.get("condition", rd.name)] = {
            "state": st.get("state"), "step_s": t.mean if t else None, "half_s": t.half if t else None,
            "tokens_per_s": tokens / t.mean if t and tokens else None, "wall_s": wall,
            "gpus": int(rd.settings().get("gpus", 1)) * int(rd.settings().get("nodes", 1)) if on_gpu else 0,
        }  # fmt: skip
    return out


def autotuner(folder: Path | None, wall: float | None) -> dict[str, Any]:
    """What DeepSpeed's autotuner did: experiments started/finished, its answer, how long it ran."""
    if folder is None or not folder.is_dir():
        return {"ran": False}
    results = folder / "autotuning_results"
    exps = [d for d in results.iterdir() if d.is_dir() and d.name != "profile_model_info"] if results.is_dir() else []
    finished = [d for d in exps if (d / "metrics.json").is_file()]
    best = None
    optimal = results / "ds_config_optimal.json"
    if optimal.is_file():
        cfg = json.loads(optimal.read_text())
        best = {"zero_stage": (cfg.get("zero_optimization") or {}).get("stage"),
                "micro_batch": cfg.get("train_micro_batch_size_per_gpu"),
                "grad_accum": cfg.get("gradient_accumulation_steps")}  # fmt: skip
    metrics = {d.name: json.loads((d / "metrics.json").read_text()) for d in finished}
    return {"ran": True, "experiments_started": len(exps), "experiments_finished": len(finished), "wall_s": wall,
            "answer": best, "metrics": metrics,
            "summary": (results / "summary.txt").read_text() if (results / "summary.txt").is_file() else None}  # fmt: skip


def model_errors(after: dict[str, Any], grid: dict[str, dict[str, Any]], probed: set[str]) -> list[dict[str, Any]]:
    rows = []
    for c in after.get("candidates", []):
        g = grid.get(c["candidate"])
        if g and g["step_s"] and c["predicted_s"]:
            rows.append({"condition": c["candidate"], "predicted_s": c["predicted_s"], "measured_s": g["step_s"],
                         "error_pct": 100 * (c["predicted_s"] - g["step_s"]) / g["step_s"],
                         "probed": c["candidate"] in probed})  # fmt: skip
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid-batch", type=Path, required=True)
    p.add_argument("--tune", type=Path, required=True, help="dstui tune --json")
    p.add_argument("--before", type=Path, help="dstui tune --dry-run --json before the search (the prior)")
    p.add_argument("--after", type=Path, help="dstui tune --dry-run --json after the search (calibrated)")
    p.add_argument("--autotune-dir", type=Path)
    p.add_argument("--autotune-wall", type=float)
    p.add_argument("--json", type=Path)
    a = p.parse_args()

    grid = grid_rows(a.grid_batch)
    tune = json.loads(a.tune.read_text()) if a.tune.is_file() and a.tune.stat().st_size else {}
    usable = {k: v for k, v in grid.items() if v["step_s"]}
    best = min(usable, key=lambda k: usable[k]["step_s"]) if usable else None
    winner = tune.get("winner")
    probed = {r["candidate"] for r in tune.get("ranking", [])}
    grid_wall = sum(v["wall_s"] or 0 for v in grid.values())
    grid_gpu = sum((v["wall_s"] or 0) * v["gpus"] for v in grid.values())
    cost = tune.get("cost") or {}
    out: dict[str, Any] = {
        "grid": grid, "grid_best": best, "grid_runs": len(grid), "grid_wall_s": grid_wall, "grid_gpu_s": grid_gpu,
        "winner": winner, "probes": len(probed), "probe_wall_s": cost.get("probe_wall_s"), "gpu_s": cost.get("gpu_s"),
        "stop_reason": tune.get("stop_reason"),
    }  # fmt: skip
    if best and winner in usable:
        out["winner_vs_best_tokens"] = usable[winner]["tokens_per_s"] / usable[best]["tokens_per_s"]
    for name, path in (("before", a.before), ("after", a.after)):
        if path and path.is_file() and path.stat().st_size:
            rows = model_errors(json.loads(path.read_text()), grid, probed)
            errs = [abs(r["error_pct"]) for r in rows]
            out[f"model_{name}"] = {"rows": rows, "median_abs_pct": statistics.median(errs) if errs else None,
                                    "worst_abs_pct": max(errs) if errs else None}  # fmt: skip
    out["autotuner"] = autotuner(a.autotune_dir, a.autotune_wall)
    print_markdown(out)
    if a.json:
        a.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


def print_markdown(o: dict[str, Any]) -> None:
    ms = lambda v: "-" if v is None else f"{v * 1e3:.1f}"  # noqa: E731
    print("| condition | state | step ms (95%) | tokens/s | wall s | probed |\n|---|---|---|---|---|---|")
    probed = {r["condition"] for r in (o.get("model_after") or {}).get("rows", []) if r["probed"]}
    for k, v in sorted(o["grid"].items(), key=lambda kv: kv[1]["step_s"] or 1e9):
        half = f" ± {ms(v['half_s'])}" if v["half_s"] and v["half_s"] != float("inf") else ""
        rate = f"{v['tokens_per_s']:,.0f}" if v["tokens_per_s"] else "-"
        mark = " (best)" if k == o["grid_best"] else " (winner)" if k == o["winner"] else ""
        print(f"| {k}{mark} | {v['state']} | {ms(v['step_s'])}{half} | {rate} | {v['wall_s'] or 0:.0f} | "
              f"{'yes' if k in probed else ''} |")  # fmt: skip
    ratio = o.get("winner_vs_best_tokens")
    print(f"\ngrid: {o['grid_runs']} runs, {o['grid_wall_s']:.0f} s wall, {o['grid_gpu_s']:.0f} GPU-s; best {o['grid_best']}")
    print(f"dstui tune: winner {o['winner']}" + (f" = {ratio:.3f} x the grid best's tokens/s" if ratio else "")
          + f"; {o['probes']} probes ({o['probes'] / max(1, o['grid_runs']):.2f} of the grid's runs), "
          f"{o['probe_wall_s'] or 0:.0f} s probe wall, {o['gpu_s'] or 0:.0f} GPU-s "
          f"({(o['gpu_s'] or 0) / max(1.0, o['grid_gpu_s']):.2f} of the grid's); stopped: {o['stop_reason']}")  # fmt: skip
    for name in ("before", "after"):
        m = o.get(f"model_{name}")
        if m and m["median_abs_pct"] is not None:
            print(f"time model {name} the search: median |error| {m['median_abs_pct']:.1f}%, worst {m['worst_abs_pct']:.1f}% "
                  f"over {len(m['rows'])} grid conditions")  # fmt: skip
    at = o["autotuner"]
    if at.get("ran"):
        print(f"DeepSpeed autotuner: {at['experiments_started']} experiments started, {at['experiments_finished']} "
              f"finished in {at['wall_s'] or 0:.0f} s; answer: {at['answer'] or 'none (no optimal config written)'}")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
