"""How long `dstui list`, `dstui ui` and `dstui ui --start` take to answer (issue 38.6: 6 s, 12.8 s, no link).

Each command runs in a fresh process against a home with one finished batch in
its SQLite MLflow store (so `dstui ui` has links to print and `dstui list` has
history to read). Wall time and the CPU time of the process (user + system,
from the children's rusage: the machine's load adds to the wall time, not to
this) are reported as medians over ``-n`` runs:

- ``list cold``: lrsweep.yaml with an empty dstui cache (DeepSpeed's answers
  not remembered yet: its import validates the configs);
- ``list warm``: the same again (answers remembered);
- ``ui``: printing the `mlflow ui` command and the two links;
- ``ui --start (to the link)``: until the chart view's link is printed (the
  server is then stopped).

``--src DIR`` runs another checkout's dstui (e.g. main's, for the numbers before).
Run: python benchmarks/cli_latency.py [-n 3] [--src DIR]
"""

from __future__ import annotations

import argparse
import os
import queue
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cpu_children() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    t, c = time.perf_counter(), cpu_children()
    proc = subprocess.run([sys.executable, "-m", "dstui", *argv], env=env, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"dstui {' '.join(argv)}: {proc.stdout}{proc.stderr}")
    return time.perf_counter() - t, cpu_children() - c


def until_link(env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """`ui --start`: seconds until the chart view's link is printed (wall; CPU is not counted: it keeps serving)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "dstui", "ui", "--start", "--port", str(port)], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout or ()], daemon=True).start()
    try:
        while (left := 120 - (time.perf_counter() - t)) > 0:
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                break
            if "viewStateShareKey" in line:
                return time.perf_counter() - t, float("nan")
        return float("nan"), float("nan")  # no link (before issue 38.6: the server starts, silently)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def make_home(home: Path) -> None:
    """One finished batch whose run is in the home's store (what `dstui ui` links to)."""
    from mlflow import MlflowClient

    from dstui.core.rundir import BatchDir, RunDir, merge_status, write_json_atomic

    c = MlflowClient(f"sqlite:///{home}/mlruns/mlflow.db")
    exp = c.create_experiment("bench")
    run = c.create_run(exp)
    b = BatchDir(home / "runs" / "bench-20260101-000000")
    merge_status(RunDir(b.path / "a-r0"), dict(name="a-r0", state="done", mlflow_run_id=run.info.run_id))
    write_json_atomic(b.batch_file, {"id": b.id, "runs": ["a-r0"], "created": 1.0, "finalized": True})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("--src", type=Path, help="another checkout whose dstui to measure (default: this one)")
    args = ap.parse_args()
    src = (args.src or REPO).resolve()
    spec = src / "configs" / "experiments" / "lrsweep.yaml"
    results: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        (home / "mlruns").mkdir(parents=True)
        env = {**os.environ, "DSTUI_HOME": str(home), "MLFLOW_TRACKING_URI": f"sqlite:///{home}/mlruns/mlflow.db",
               "PYTHONPATH": str(src), "DSTUI_CACHE": str(Path(tmp) / "cache")}  # fmt: skip
        env.pop("DSTUI_RUNS_DIR", None)
        os.environ.update(DSTUI_HOME=env["DSTUI_HOME"], MLFLOW_TRACKING_URI=env["MLFLOW_TRACKING_URI"])
        make_home(home)
        for _ in range(args.n):
            shutil.rmtree(env["DSTUI_CACHE"], ignore_errors=True)
            results.setdefault("list cold", []).append(timed(["list", str(spec)], env, src))
            results.setdefault("list warm", []).append(timed(["list", str(spec)], env, src))
            results.setdefault("ui", []).append(timed(["ui"], env, src))
            results.setdefault("ui --start (to the link)", []).append(until_link(env, src))
    load = os.getloadavg()[0]
    print(f"dstui from {src}; median of {args.n}; load average {load:.1f} on {os.cpu_count()} cores")
    for name, values in results.items():
        wall = statistics.median(v[0] for v in values)
        cpu = statistics.median(v[1] for v in values)
        shown = "no link printed" if wall != wall else f"{wall:6.2f} s wall"
        print(f"  {name:26s} {shown}" + ("" if cpu != cpu else f"  {cpu:5.2f} s CPU"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
