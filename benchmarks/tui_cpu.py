"""CPU use of the TUI while it watches 8 live runs (goal: < 15% of one core).

Eight synthetic runs in one batch append at a realistic rate (a step record
and a stdout line per run every --step-s seconds, a system.jsonl reading every
2 s, status.json rewritten every second, as the supervisor does). The TUI
runs headless under a pseudo-terminal with the live view open on the batch
(`dstui tui --batch ID --live`); psutil measures its CPU time over the window.
Run: python benchmarks/tui_cpu.py [--seconds 30] [--history 2000]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tui_pty import PtyApp  # noqa: E402

from dstui.core.rundir import write_json_atomic  # noqa: E402

N_RUNS = 8


def step_record(run: int, step: int, t: float) -> dict:
    return {
        "type": "step", "time": t, "step": step, "epoch": 1,
        "loss": 6.0 * math.exp(-step / 500) + 0.05 * math.sin(step + run),
        "iter_time": 0.25 + 0.02 * math.sin(step / 7 + run), "tokens_per_s": 4000.0 + run,
        "mem_alloc": 2e9 + run * 1e8, "mem_peak": 3e9 + run * 1e8 + step * 10,
    }  # fmt: skip


def setup(home: Path, history: int, steps_total: int) -> tuple[str, list[Path]]:
    bid = "bench-20260101-000000"
    batch = home / "runs" / bid
    runs = []
    now = time.time()
    for i in range(N_RUNS):
        rd = batch / f"c{i}-r0"
        rd.mkdir(parents=True)
        write_json_atomic(rd / "spec.json", {"name": rd.name, "order": i, "settings": {"metrics_format": "jsonl"}})
        with open(rd / "metrics.jsonl", "w") as fh:
            fh.write(json.dumps({"type": "header", "time": now}) + "\n")
            for s in range(1, history + 1):
                fh.write(json.dumps(step_record(i, s, now - history + s)) + "\n")
        with open(rd / "stdout.log", "w") as fh:
            fh.writelines(f"step {s} of {rd.name}\n" for s in range(1, history + 1))
        write_status(rd, i, history, steps_total)
        runs.append(rd)
    # finalized: nobody takes this batch over (there is no real job behind it)
    write_json_atomic(batch / "batch.json", {"id": bid, "experiment": "bench", "runs": [r.name for r in runs],
                                             "created": now, "finalized": True})  # fmt: skip
    return bid, runs


def write_status(rd: Path, i: int, step: int, total: int) -> None:
    rec = step_record(i, step, time.time())
    write_json_atomic(rd / "status.json", {
        "name": rd.name, "order": i, "state": "running", "steps_done": step, "steps_total": total,
        "started": time.time() - 100, "last": {k: rec[k] for k in ("loss", "iter_time", "tokens_per_s", "mem_peak")},
    })  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--history", type=int, default=2000, help="steps each run already has")
    ap.add_argument("--step-s", type=float, default=0.5, help="seconds between steps per run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        bid, runs = setup(home, args.history, args.history + 100_000)
        env = {**os.environ, "DSTUI_HOME": str(home), "MLFLOW_TRACKING_URI": f"sqlite:///{home}/mlflow.db"}
        app = PtyApp(["tui", "--batch", bid, "--live"], env)
        try:
            proc = psutil.Process(app.proc.pid)
            step = args.history
            next_status = next_sys = 0.0
            warm_until = time.time() + 5.0  # start-up and the first full read are not the steady state
            t_start = cpu_start = None
            end = warm_until + args.seconds
            while time.time() < end:
                now = time.time()
                step += 1
                for i, rd in enumerate(runs):
                    with open(rd / "metrics.jsonl", "a") as fh:
                        fh.write(json.dumps(step_record(i, step, now)) + "\n")
                    with open(rd / "stdout.log", "a") as fh:
                        fh.write(f"Epoch 1, Step {step}, Loss: 1.0 sync: True time: 0.25 of {rd.name}\n")
                if now >= next_sys:
                    next_sys = now + 2.0
                    for i, rd in enumerate(runs):
                        with open(rd / "system.jsonl", "a") as fh:
                            fh.write(json.dumps({"time": now, "node": "bench", "cpu_percent": 50.0,
                                                 "job_cpu_percent": 180.0 + i, "job_rss_bytes": 2e9}) + "\n")  # fmt: skip
                if now >= next_status:
                    next_status = now + 1.0
                    for i, rd in enumerate(runs):
                        write_status(rd, i, step, args.history + 100_000)
                if t_start is None and now >= warm_until:
                    t_start = time.time()
                    ct = proc.cpu_times()
                    cpu_start = ct.user + ct.system
                if app.proc.poll() is not None:
                    raise RuntimeError(f"the TUI exited: {bytes(app.output)[-2000:]!r}")
                time.sleep(args.step_s)
            ct = proc.cpu_times()
            cpu = ct.user + ct.system - cpu_start
            wall = time.time() - t_start
        finally:
            app.close()
    pct = 100.0 * cpu / wall
    print(f"TUI CPU while watching {N_RUNS} live runs ({args.history}+ steps each, a step per run every "
          f"{args.step_s:g} s): {pct:.1f}% of one core over {wall:.0f} s; goal < 15%")  # fmt: skip
    return 0 if pct < 15 else 1


if __name__ == "__main__":
    sys.exit(main())
