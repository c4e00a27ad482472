"""How long `export_report` takes over 50 runs x 10,000 steps (goal: under 15 s).

Builds a throw-away MLflow SQLite store laid out as the supervisor writes it
(a parent batch run, 50 nested child runs of 5 conditions x 10 repeats, with
tags, params and 7 step metrics each: loss, iter_time, tokens_per_s,
tflops_per_gpu, mem_alloc, mem_peak, lr -> 3.5 million values), then times
the report export end to end (search, histories, statistics, charts, CSV,
JSON, markdown, artifact upload).

Runs, params and tags go through MlflowClient. The 3.5 million metric rows
are, by default, inserted with one executemany into MLflow's own ``metrics``
and ``latest_metrics`` tables: through ``log_batch`` (~0.1 ms per value here)
filling the store alone would take about six minutes, and what is measured is
the report, not the filling. ``--log-batch`` fills it the slow, public way.

    python benchmarks/report_speed.py [--runs 50] [--steps 10000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KEYS = ("loss", "iter_time", "tokens_per_s", "tflops_per_gpu", "mem_alloc", "mem_peak", "lr")
GB = 1024**3


def step_values(cond: int, repeat: int, step: int, rng: random.Random) -> dict[str, float]:
    base = 0.2 + 0.05 * cond
    it = base * (20 if step == 1 else 1.0) + rng.uniform(-0.01, 0.01) + (base * 5 if rng.random() < 1e-4 else 0)
    return {
        "loss": 10.0 * math.exp(-step / 3000) + 0.5 + rng.uniform(-0.02, 0.02),
        "iter_time": it,
        "tokens_per_s": 4096 / it,
        "tflops_per_gpu": 0.5 / it,
        "mem_alloc": (2.0 - 0.3 * cond) * GB,
        "mem_peak": (3.0 - 0.4 * cond) * GB + step,
        "lr": 1e-4,
    }


def build(uri: str, runs: int, steps: int, *, log_batch: bool) -> tuple[str, str]:
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    client = MlflowClient(uri)
    exp_id = client.create_experiment("bench", artifact_location=(Path(uri[10:]).parent / "artifacts").as_uri())
    batch = "bench-20260101-000000"
    parent = client.create_run(exp_id, run_name=batch, tags={"dstui.role": "batch", "dstui.batch": batch})
    pid = parent.info.run_id
    conds = 5
    rows: list[tuple[str, float, int, int, int, str]] = []
    latest: list[tuple[str, float, int, int, int, str]] = []
    ts = int(time.time() * 1000)
    for i in range(runs):
        cond, repeat = i % conds, i // conds
        name = f"z{cond}-r{repeat}"
        tags = {
            "mlflow.parentRunId": pid, "dstui.role": "run", "dstui.batch": batch, "dstui.condition": f"z{cond}",
            "dstui.revision": "installed", "dstui.repeat": str(repeat), "dstui.kind": "train", "dstui.status": "done",
            "dstui.reason": "", "dstui.hostname": "bench", "dstui.device": "cuda", "dstui.gpu_name": "H100",
            "dstui.gpu_count": "8", "dstui.version.deepspeed": "0.19.8", "dstui.version.torch": "2.11.0",
        }
        rid = client.create_run(exp_id, run_name=name, tags=tags).info.run_id
        params = {"model": "llama-1b", "micro_batch": 4, "grad_accum": 1, "seq_length": 1024, "gpus": 8,
                  "zero_stage": cond % 4, "warmup_steps": 2, "steps": steps,
                  "ds.zero_optimization.stage": cond % 4, "ds.train_micro_batch_size_per_gpu": 4}
        client.log_batch(rid, params=[Param(k, str(v)) for k, v in params.items()])
        rng = random.Random(i)
        run_rows = []
        for s in range(1, steps + 1):
            for k, v in step_values(cond, repeat, s, rng).items():
                run_rows.append((k, v, ts + s, s, 0, rid))
        if log_batch:
            ms = [Metric(k, v, t, s) for k, v, t, s, _, _ in run_rows]
            for j in range(0, len(ms), 1000):
                client.log_batch(rid, metrics=ms[j : j + 1000])
        else:
            rows += run_rows
            latest += [r for r in run_rows[-len(KEYS) :]]
        client.set_terminated(rid, "FINISHED")
    if rows:
        import sqlalchemy as sa

        engine = sa.create_engine(uri)
        with engine.begin() as conn:
            raw = conn.connection.driver_connection
            raw.executemany(
                "INSERT INTO metrics (key, value, timestamp, step, is_nan, run_uuid) VALUES (?, ?, ?, ?, ?, ?)", rows
            )
            raw.executemany(
                "INSERT INTO latest_metrics (key, value, timestamp, step, is_nan, run_uuid) VALUES (?, ?, ?, ?, ?, ?)",
                latest,
            )
        engine.dispose()
    client.set_terminated(pid, "FINISHED")
    return "bench", batch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--log-batch", action="store_true", help="fill the store through MlflowClient.log_batch")
    ap.add_argument("--keep", metavar="DIR", help="build in DIR and keep it (store and report)")
    args = ap.parse_args()

    from dstui.usecases.report import export_report

    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="dstui-bench-"))
    tmp.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    try:
        t0 = time.perf_counter()
        exp, batch = build(uri, args.runs, args.steps, log_batch=args.log_batch)
        t_build = time.perf_counter() - t0
        stages: list[tuple[float, str]] = []
        t0, c0 = time.perf_counter(), time.process_time()
        report = export_report(
            exp, tmp / "report", batch=batch, tracking_uri=uri,
            progress=lambda f, m: stages.append((time.perf_counter() - t0, m)),
        )
        t_report, c_report = time.perf_counter() - t0, time.process_time() - c0
        values = args.runs * args.steps * len(KEYS)
        print(f"store: {args.runs} runs x {args.steps} steps x {len(KEYS)} metrics = {values:,} values "
              f"(built in {t_build:.1f} s{' via log_batch' if args.log_batch else ''})")
        prev = 0.0
        for t, msg in stages:
            print(f"  {t:6.2f} s (+{t - prev:5.2f})  {msg}")
            prev = t
        size = sum(p.stat().st_size for p in report.parent.iterdir()) / 1e6
        print(f"export_report: {t_report:.2f} s wall, {c_report:.2f} s CPU (all threads)  (goal < 15 s wall)")
        print(f"  -> {report} ({size:.0f} MB in the folder)")
        print(f"  load average while measuring: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
        return 0 if t_report < 15 else 1
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
