"""`dstui import` of a large seed log: is memory bounded, and is progress shown?

Generates a seed-format log of ``--mb`` MB (the seed's per-step lines, some ordinary log
lines between them, one closing summary line), then runs the real `dstui import` on it in
a child process (its own DSTUI_HOME and SQLite store) and reports: wall time, the child's
peak resident memory (``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss``), steps imported,
and the progress lines it printed on stderr (their count and the last one).

Usage: python benchmarks/import_large.py [--mb 100] [--keep DIR]
Numbers go into docs/BENCHMARKS.md ("Import of a large log").
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_log(path: Path, mb: int) -> int:
    """A seed log of about ``mb`` MB; returns its step count."""
    rnd = random.Random(0)
    target = mb * 1_000_000
    steps = 0
    with open(path, "w") as fh:
        fh.write("Namespace(model_name='meta-llama/Llama-3.2-1B', batch_size=1, seq_length=512, zero_stage=3)\n")
        while fh.tell() < target:
            steps += 1
            loss = 10.0 / (1 + steps / 1000) + rnd.random() * 0.01
            fh.write(f"Epoch 1, Step {steps}, Loss: {loss:.6f} sync: True time: {0.1 + rnd.random() * 0.01:.6f} "
                     f"alloc_mem: {28307113472 + steps} peak_mem: {50064946688 + steps}\n")  # fmt: skip
            if steps % 100 == 0:
                fh.write(f"[INFO] step {steps}: checkpoint skipped\n")
        fh.write("meta-llama/Llama-3.2-1B ds=True np=8 batch_size=1 seq=512 zero_stage=3 acc=1 ac=False "
                 "compile=False iteration time: 0.1050 alloc_mem: 28307113472 peak_mem: 50064946688\n")  # fmt: skip
    return steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it")
    a = ap.parse_args()
    root = a.keep or Path(tempfile.mkdtemp(prefix="dstui-import-bench-"))
    (root / "logs").mkdir(parents=True, exist_ok=True)
    (root / "mlruns").mkdir(exist_ok=True)
    log = root / "logs" / "train.log"
    steps = write_log(log, a.mb)
    size = log.stat().st_size
    print(f"log: {size / 1e6:.1f} MB, {steps:,} steps", flush=True)
    env = {**os.environ, "DSTUI_HOME": str(root), "MLFLOW_TRACKING_URI": f"sqlite:///{root}/mlruns/mlflow.db"}
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "dstui", "import", str(root / "logs"), "-e", "bench"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stderr is not None and proc.stdout is not None
    progress, other = [], []
    for line in proc.stderr:  # as it comes, with the time since start and the child's resident memory now
        (progress if line.startswith("import: ") else other).append(line.rstrip())
        print(f"  +{time.time() - t0:6.0f} s  rss {_rss_mib(proc.pid):5.0f} MiB  {line.rstrip()}", flush=True)
    out = proc.stdout.read()
    code = proc.wait()
    wall = time.time() - t0
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
    print(f"dstui import: exit {code}, {wall:.1f} s, peak RSS {peak_mib:.0f} MiB")
    print(f"progress lines on stderr: {len(progress)}; last: {progress[-1] if progress else '-'}")
    print(out.strip().splitlines()[0] if out.strip() else "\n".join(other[-20:]))
    return code


def _rss_mib(pid: int) -> float:
    """The child's resident memory now (from /proc), 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


if __name__ == "__main__":
    sys.exit(main())
