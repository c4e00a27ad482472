#!/usr/bin/env python
"""How soon after an op build starts does the user see "building op"? (issue 26: within 2 s)

Runs `dstui run` on a one-run `kind: command` batch whose program starts a real ninja build
(a 6-s rule in a folder named like an op, as torch's JIT builds DeepSpeed's ops) after
writing the time it starts it. Meanwhile this script reads the run's status.json every
50 ms, and timestamps each line `dstui run` prints. Reported per round: build start ->
status.json says "building op" (what the TUI's next tick shows), and -> `dstui run` prints it.

    .ci/with-env python benchmarks/phase_latency.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PROGRAM = """
import os, subprocess, time
op = os.path.join(os.getcwd(), "fake_shm_op")
os.makedirs(op, exist_ok=True)
open(os.path.join(op, "build.ninja"), "w").write("rule slow\\n  command = sleep 6\\nbuild out: slow\\n")
open(os.path.join(os.getcwd(), "build_started"), "w").write(repr(time.time()))
subprocess.run([NINJA], cwd=op, check=True)
print("Epoch 1, Step 1, Loss: 1.0", flush=True)
"""


def one_round(ninja: str) -> tuple[float, float]:
    home = Path(tempfile.mkdtemp(prefix="dstui-phase-"))
    spec = home / "phase.yaml"
    code = PROGRAM.replace("NINJA", repr(ninja))
    spec.write_text(json.dumps({
        "name": "phase", "settings": {"kind": "command", "metrics_format": "seed", "steps": 1, "warmup_steps": 0},
        "conditions": [{"name": "r", "command": ["{python}", "-c", code]}],
    }))  # fmt: skip
    env = {**os.environ, "DSTUI_HOME": str(home), "MLFLOW_TRACKING_URI": f"sqlite:///{home}/mlflow.db"}
    proc = subprocess.Popen([sys.executable, "-m", "dstui", "run", str(spec)], env=env, cwd=home,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    printed: list[float] = []

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            if "building op fake_shm_op" in line and not printed:
                printed.append(time.time())

    threading.Thread(target=read, daemon=True).start()
    seen = None
    while proc.poll() is None:
        for st_file in home.glob("runs/*/r-r0/status.json"):
            try:
                if seen is None and "building op" in (json.loads(st_file.read_text()).get("phase") or ""):
                    seen = time.time()
            except ValueError:
                pass
        time.sleep(0.05)
    proc.wait()
    time.sleep(0.2)
    started = float((home / "build_started").read_text())  # command runs start in the cwd of `dstui run`
    shutil.rmtree(home, ignore_errors=True)
    if seen is None or not printed:
        raise SystemExit("the phase was never shown")
    return seen - started, printed[0] - started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    ninja = shutil.which("ninja", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if ninja is None:
        raise SystemExit("ninja is not installed (pip install ninja)")
    status_s, printed_s = [], []
    for i in range(a.rounds):
        s, p = one_round(ninja)
        status_s.append(s)
        printed_s.append(p)
        print(f"round {i + 1}: status.json {s:.2f} s, dstui run's output {p:.2f} s after the build started", flush=True)
    print(f"median: status.json {statistics.median(status_s):.2f} s, dstui run {statistics.median(printed_s):.2f} s; "
          f"worst {max(status_s):.2f} / {max(printed_s):.2f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
