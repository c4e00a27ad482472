"""CPU cost of a DeepSpeed rank's start-up: a real 2-rank tiny run, N times, per rank.

Each run is what dstui launches (``python -m dstui.execute.injob.ranks --nproc 2 --
python runners/train.py --model tiny-llama ...``, CPU, gloo); every rank is wrapped
in ``/usr/bin/time`` so its own user+sys CPU-s is read, not the launcher's. The
wall phases come from the runner's ``phases`` record (imports, group up, model
built, engine up, steps, exit). ``--tree DIR`` runs the same against another
checkout (``git worktree add /tmp/rs-base main``); trees are interleaved run by
run so before/after share the machine's state::

    .ci/with-env python benchmarks/rank_startup.py --runs 3 --tree /tmp/rs-base --tree .

For where the imports go: ``--profile DIR`` runs once with ``python -X importtime``
in every rank and writes ``rankN.importtime`` there (sort by the cumulative column).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PHASE_ORDER = (
    "process_start",
    "imports_done",
    "group_up",
    "model_built",
    "engine_ready",
    "first_step_done",
    "last_step_done",
    "exit",
)  # fmt: skip  (runners/phases.py MARKS)


def run_once(tree: Path, port: int, steps: int, profile: Path | None) -> dict:
    """One 2-rank run from ``tree``: CPU-s of each rank and the rank-0 phase durations."""
    with tempfile.TemporaryDirectory(prefix="rank_startup_") as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        # the rank starter runs ``PYTHON -u SCRIPT ...``: PYTHON is this wrapper, which times the rank
        extra, redirect = "", ""
        if profile is not None:
            profile.mkdir(parents=True, exist_ok=True)
            extra = "-X importtime"  # the runner leaves by os._exit: no cProfile dump at exit
            redirect = f' 2>"{profile}/rank$LOCAL_RANK.importtime"'
        wrapper = Path(tmp) / "py"
        wrapper.write_text(
            f'#!/bin/sh\nu="$1"; shift\nexec /usr/bin/time -f "%U %S" -a -o "{tmp}/cpu" '
            f'"{sys.executable}" "$u" {extra} "$@"{redirect}\n'
        )
        wrapper.chmod(0o755)
        cmd = [
            sys.executable, "-m", "dstui.execute.injob.ranks", "--nproc", "2",
            "--master-port", str(port), "--", str(wrapper),
            str(tree / "runners" / "train.py"), "--model", "tiny-llama", "--steps", str(steps),
            "--metrics-file", str(metrics),
        ]  # fmt: skip
        env = dict(os.environ, PYTHONPATH=str(tree))
        err = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
        if err.returncode != 0:
            raise SystemExit(f"run failed in {tree} (exit {err.returncode}):\n{err.stderr[-3000:]}")
        cpu = [
            sum(map(float, line.split()))
            for line in (Path(tmp) / "cpu").read_text().splitlines()
            if line.strip()
        ]
        phases = {}
        for line in metrics.read_text().splitlines():
            rec = json.loads(line)
            if (
                rec.get("kind") == "phases"
                or rec.get("record") == "phases"
                or "imports_done" in rec
            ):
                marks = [(k, rec[k]) for k in PHASE_ORDER if k in rec]
                phases = {
                    b: round(tb - ta, 3) for (a, ta), (b, tb) in zip(marks, marks[1:], strict=False)
                }
        return {"cpu_per_rank": cpu, "phases": phases}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--tree", action="append", type=Path, help="checkout(s) to compare (default: this one)"
    )
    ap.add_argument("--runs", type=int, default=3, help="runs per tree, interleaved (default 3)")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps per run (default 3)")
    ap.add_argument("--port", type=int, default=29731)
    ap.add_argument(
        "--profile", type=Path, help="write -X importtime and cProfile output of one run here"
    )
    a = ap.parse_args()
    trees = [t.resolve() for t in (a.tree or [Path(__file__).resolve().parent.parent])]
    if a.profile is not None:
        run_once(trees[-1], a.port, a.steps, a.profile)
        print(f"profile written under {a.profile}")
        return 0
    results: dict[Path, list[dict]] = {t: [] for t in trees}
    for i in range(a.runs):
        for t in trees:
            r = run_once(t, a.port + i, a.steps, None)
            results[t].append(r)
            print(
                f"run {i + 1} {t}: CPU-s per rank {r['cpu_per_rank']} phases(wall, rank 0) {r['phases']}",
                flush=True,
            )
    print("\nmedian over runs:")
    for t, rs in results.items():
        cpu = statistics.median(c for r in rs for c in r["cpu_per_rank"])
        keys = rs[0]["phases"].keys()
        ph = {k: round(statistics.median(r["phases"].get(k, 0.0) for r in rs), 2) for k in keys}
        print(f"{t}: {cpu:.2f} CPU-s per rank; wall phases {ph}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
