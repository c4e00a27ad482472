"""How fast do metrics get from a run's metrics.jsonl into MLflow (SQLite)?

Three ways, in one process, each into its own fresh store so they do not
slow each other down:

1. naive: one ``MlflowClient.log_metric`` call per value (on a sample: it is slow);
2. direct: MLflow's own ``log_batch`` fed with pre-built ``Metric`` objects in
   chunks of 1000 -- the practical limit of the store;
3. dstui: the supervisor's real ingestion path (``RunFollower.follow`` on a run
   folder: follow the file, parse, batch, send, persist offsets, finalize).

Goal: dstui >= 80% of direct, and >= 30x naive.
Usage: python benchmarks/ingest.py [--steps 100000] [--naive-sample 3000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

METRICS = ("loss", "iter_time", "tokens_per_s", "tflops_per_gpu", "mfu", "mem_alloc", "mem_peak", "lr")


def write_metrics(path: Path, steps: int) -> None:
    rnd = random.Random(0)
    t0 = 1_700_000_000.0
    with open(path, "w") as fh:
        fh.write(json.dumps({"type": "header", "time": t0, "versions": {}}) + "\n")
        for s in range(1, steps + 1):
            rec = {"type": "step", "time": t0 + s * 0.1, "step": s, "epoch": 1}
            for m in METRICS:
                rec[m] = rnd.random()
            fh.write(json.dumps(rec) + "\n")


def store(tmp: Path, name: str) -> str:
    d = tmp / name
    d.mkdir()
    return f"sqlite:///{d}/mlflow.db"


def new_run(uri: str) -> tuple:
    from mlflow import MlflowClient

    c = MlflowClient(uri)
    exp = c.create_experiment("bench")
    return c, c.create_run(exp).info.run_id


def bench_naive(tmp: Path, n_values: int) -> float:
    c, rid = new_run(store(tmp, "naive"))
    t = time.perf_counter()
    for i in range(n_values):
        c.log_metric(rid, METRICS[i % 8], float(i), timestamp=1000 + i, step=i // 8)
    return n_values / (time.perf_counter() - t)


def bench_direct(tmp: Path, steps: int) -> float:
    from mlflow.entities import Metric

    c, rid = new_run(store(tmp, "direct"))
    rnd = random.Random(0)
    metrics = [
        Metric(m, rnd.random(), 1000 + s, s) for s in range(1, steps + 1) for m in METRICS
    ]
    t = time.perf_counter()
    for i in range(0, len(metrics), 1000):
        c.log_batch(rid, metrics=metrics[i : i + 1000])
    return len(metrics) / (time.perf_counter() - t)


def bench_dstui(tmp: Path, steps: int) -> tuple[float, int]:
    from mlflow import MlflowClient

    from dstui.core.rundir import BatchDir, RunDir, merge_status, write_json_atomic
    from dstui.execute.supervisor import Supervisor

    uri = store(tmp, "dstui")
    batch = BatchDir(tmp / "runs" / "bench-batch")
    rd = RunDir(batch.path / "r0")
    rd.path.mkdir(parents=True)
    write_metrics(rd.metrics_file, steps)
    write_json_atomic(rd.spec_file, {"name": "r0", "condition": "r", "repeat": 0, "key": "k",
                                     "settings": {"kind": "train", "metrics_format": "jsonl"}})  # fmt: skip
    write_json_atomic(rd.exit_file, {"exit_code": 0, "signal": None})
    merge_status(rd, dict(name="r0", state="done", steps_total=steps))
    write_json_atomic(batch.batch_file, {"id": batch.id, "experiment": "bench", "runs": ["r0"],
                                         "tracking_uri": uri})  # fmt: skip
    sup = Supervisor(batch, tracking_uri=uri)
    sup.sink.parent_run_id()
    sup.sink.child_run_id(rd)
    t = time.perf_counter()
    while not sup.follower.tracked_of(rd).finalized:
        sup.follower.follow(rd)
    elapsed = time.perf_counter() - t
    hist = MlflowClient(uri).get_metric_history(rd.status()["mlflow_run_id"], "loss")
    return steps * len(METRICS) / elapsed, len(hist)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--naive-sample", type=int, default=3000, help="values for the naive loop")
    args = ap.parse_args()
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import logging

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        naive = bench_naive(tmp, args.naive_sample)
        direct = bench_direct(tmp, args.steps)
        dstui_rate, n_loss = bench_dstui(tmp, args.steps)
    assert n_loss == args.steps, f"history has {n_loss} loss points, expected {args.steps}"
    print(f"steps={args.steps} metrics/step={len(METRICS)} values={args.steps * len(METRICS)}")
    print(f"naive log_metric : {naive:10.0f} values/s (sample of {args.naive_sample})")
    print(f"direct log_batch : {direct:10.0f} values/s")
    print(f"dstui ingestion  : {dstui_rate:10.0f} values/s")
    print(f"dstui / direct   : {dstui_rate / direct:10.1%}   (goal >= 80%)")
    print(f"dstui / naive    : {dstui_rate / naive:10.1f}x  (goal >= 30x)")


if __name__ == "__main__":
    main()
