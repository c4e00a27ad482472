#!/usr/bin/env python
"""Turnaround of a whole batch, old path against new path, interleaved, in one run (issue 12).

Each round runs the same spec twice through `dstui run` (foreground, a fresh
DSTUI_HOME and MLflow store each time), once per path, in alternating order,
so load from other users of a shared machine hits both paths alike:

* old: DeepSpeed's launcher starts the ranks (``DSTUI_RANK_LAUNCHER=deepspeed``)
  and runs go one after another (``--parallel 1``): what dstui did before;
* new: dstui starts the ranks itself (dstui.execute.injob.ranks) and runs share the
  box on disjoint GPUs where it has them (``--parallel 0``, the default).
* no-bytecode-cache: new, but without the bytecode cache dstui gives the
  processes it starts where the environment forbids bytecode
  (``DSTUI_BYTECODE_CACHE=0``; dstui.execute.bytecode). ``--paths
  no-bytecode-cache new --warmup`` measures that cache alone.

Measured: the wall time of the whole `dstui run` process, and per run the
time breakdown the supervisor stored (dstui.core.phases: launch, imports,
init, compile, steps, teardown; the batch's step share).

    python benchmarks/turnaround.py [--spec configs/experiments/smoke.yaml] [--rounds 2] [--only z0 z3]
                                    [--paths old new] [--warmup]

Prints a table and one JSON object; docs/BENCHMARKS.md records the results.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dstui.core import phases  # noqa: E402
from dstui.core.rundir import list_batches  # noqa: E402

PATHS = {
    "old": ({"DSTUI_RANK_LAUNCHER": "deepspeed"}, ["--parallel", "1"]),
    "new": ({}, ["--parallel", "0"]),
    "no-bytecode-cache": ({"DSTUI_BYTECODE_CACHE": "0"}, ["--parallel", "0"]),
}


def run_batch(path: str, spec: Path, only: list[str]) -> dict:
    env_extra, args = PATHS[path]
    with tempfile.TemporaryDirectory(prefix=f"dstui-turnaround-{path}-") as home:
        env = {**os.environ, **env_extra, "DSTUI_HOME": home}
        env.pop("MLFLOW_TRACKING_URI", None)
        cmd = [sys.executable, "-m", "dstui", "run", str(spec), "--quiet", *args]
        if only:
            cmd += ["--only", *only]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
        wall = time.monotonic() - t0
        if proc.returncode != 0:
            raise SystemExit(f"{path} batch failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        (batch,) = list_batches(Path(home) / "runs")
        statuses = [rd.status() for rd in batch.runs()]
        runs = {rd.name: phases.from_status(st) for rd, st in zip(batch.runs(), statuses, strict=True)}
        share = phases.batch_step_share(statuses)
    run_walls = [b.wall for b in runs.values() if b and b.wall]
    return {
        "wall": wall,
        # the batch's time outside its runs: CLI, spec validation, supervisor start, gaps, MLflow
        "outside_runs": wall - sum(run_walls),
        "step_share": share[0] if share else None,
        "runs": {name: b.as_dict() if b else None for name, b in runs.items()},
    }


def mean_segments(results: list[dict]) -> dict[str, float]:
    """Mean seconds per segment over every run of every round."""
    out = {}
    for seg in (*phases.SEGMENTS, "wall"):
        vals = [r[seg] for res in results for r in res["runs"].values() if r and r.get(seg) is not None]
        out[seg] = statistics.fmean(vals) if vals else float("nan")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", type=Path, default=REPO / "configs" / "experiments" / "smoke.yaml")
    p.add_argument("--rounds", type=int, default=2, help="old+new pairs, order alternating")
    p.add_argument("--only", nargs="*", default=[], help="run only these conditions (dstui run --only)")
    p.add_argument("--paths", nargs=2, choices=sorted(PATHS), default=["old", "new"], metavar="PATH",
                   help=f"the two paths to compare, first = 'old' in the table (of: {', '.join(PATHS)})")
    p.add_argument("--first", choices=["old", "new"], default="old", help="the path round 1 starts with")
    p.add_argument("--warmup", action="store_true",
                   help="one uncounted batch of the new path first (fills caches that outlive a batch)")
    a = p.parse_args()
    named = dict(zip(("old", "new"), a.paths, strict=True))
    if a.warmup:
        res = run_batch(named["new"], a.spec.resolve(), a.only)
        print(f"warm-up {named['new']}: {res['wall']:.1f} s", file=sys.stderr, flush=True)
    results: dict[str, list[dict]] = {"old": [], "new": []}
    for i in range(a.rounds):
        order = ("old", "new") if a.first == "old" else ("new", "old")
        for path in order if i % 2 == 0 else order[::-1]:
            res = run_batch(named[path], a.spec.resolve(), a.only)
            results[path].append(res)
            print(f"round {i + 1} {named[path]}: {res['wall']:.1f} s", file=sys.stderr, flush=True)
    walls = {k: statistics.fmean(r["wall"] for r in v) for k, v in results.items()}
    segs = {k: mean_segments(v) for k, v in results.items()}
    print(f"{'path':5} {'batch wall':>10} " + " ".join(f"{s:>9}" for s in (*phases.SEGMENTS, "run wall")))
    for k in ("old", "new"):
        row = " ".join(f"{segs[k][s]:9.2f}" for s in (*phases.SEGMENTS, "wall"))
        print(f"{k:5} {walls[k]:10.1f} {row}")
    outside = {k: statistics.fmean(r["outside_runs"] for r in v) for k, v in results.items()}
    print(f"outside the runs (CLI, validation, supervisor, gaps): old {outside['old']:.1f} s, new {outside['new']:.1f} s")
    print(f"new/old batch wall: {walls['new'] / walls['old']:.2f}")
    print(f"old = {named['old']}, new = {named['new']}")
    print(json.dumps({"spec": str(a.spec), "rounds": a.rounds, "only": a.only, "paths": named, "wall": walls,
                      "ratio": walls["new"] / walls["old"], "segments": segs, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
