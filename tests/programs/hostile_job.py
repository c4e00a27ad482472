"""A job that does to its own run folder what a buggy or hostile program can: for the untrusted-run tests.

It writes ``--steps`` metrics (JSON records to DSTUI_METRICS_FILE, or the seed's lines to
stdout with ``--format seed``), then changes files of its run folder as a JSON plan says,
and exits with ``--exit``. Plan entries are ``{"file": NAME, "as": KIND, ...}``:

  zero_link       NAME becomes a symbolic link to /dev/zero
  fifo            NAME becomes a FIFO (nobody writes to it)
  fifo_link       NAME becomes a link to a FIFO in --scratch
  outside_link    NAME becomes a link to a file in --scratch (``size`` bytes of text)
  outside_dir     NAME becomes a link to the folder --scratch/victim
  dir             NAME becomes a folder
  sparse          NAME becomes a sparse file of ``size`` bytes (a few records at its start)
  binary          NAME becomes ``size`` random bytes (``seed`` for the generator)
  cr_lines        NAME gets ``n`` records (or seed lines) joined by bare CRs, then a newline

``--helper PIDFILE`` first starts ``setsid sleep 3000`` (a helper in a session of its own,
inheriting the job's environment) and writes its pid; ``--once FILE`` applies the plan only
while FILE does not exist (and creates it), so a retried attempt behaves.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path


def record(step: int) -> str:
    return json.dumps({"type": "step", "time": time.time(), "step": step, "epoch": 1, "loss": 10.0 / step, "iter_time": 0.01})


def seed(step: int) -> str:
    return f"Epoch 1, Step {step}, Loss: {10.0 / step:.6f} sync: True time: 0.010000 alloc_mem: 1 peak_mem: 2"


def replace(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def apply(run_dir: Path, scratch: Path, entry: dict, fmt: str) -> None:
    path = run_dir / entry["file"]
    kind = entry["as"]
    replace(path)
    if kind == "zero_link":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "fifo_link":
        target = scratch / f"{entry['file']}.fifo"
        if not target.exists():
            os.mkfifo(target)
        path.symlink_to(target)
    elif kind == "outside_link":
        target = scratch / f"{entry['file']}.outside"
        target.write_text("x" * int(entry.get("size", 100)))
        path.symlink_to(target)
    elif kind == "outside_dir":
        path.symlink_to(scratch / "victim")
    elif kind == "dir":
        path.mkdir()
    elif kind == "sparse":
        with open(path, "wb") as fh:
            fh.write(("\n".join(record(s) for s in (1, 2)) + "\n").encode())
            fh.truncate(int(entry["size"]))
    elif kind == "binary":
        rng = random.Random(entry.get("seed", 0))
        path.write_bytes(bytes(rng.getrandbits(8) for _ in range(int(entry["size"]))))
    elif kind == "cr_lines":
        make = seed if fmt == "seed" else record
        path.write_text("\r".join(make(s) for s in range(1, int(entry.get("n", 3)) + 1)) + "\n")
    else:
        raise SystemExit(f"unknown kind {kind!r}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--interval", type=float, default=0.0)
    ap.add_argument("--format", choices=("jsonl", "seed"), default="jsonl")
    ap.add_argument("--plan", default="[]", help="the plan as JSON text, or @FILE")
    ap.add_argument("--scratch", default="")
    ap.add_argument("--helper", default="")
    ap.add_argument("--once", default="")
    ap.add_argument("--exit", type=int, default=0)
    ap.add_argument("--wait-ingested", type=int, default=0, help="before the plan: until status.json counts N steps")
    a = ap.parse_args()
    run_dir = Path(os.environ["DSTUI_RUN_DIR"])
    plan = json.loads(Path(a.plan[1:]).read_text() if a.plan.startswith("@") else a.plan)
    if a.helper:
        helper = subprocess.Popen(["sleep", "3000"], start_new_session=True)
        Path(a.helper).write_text(str(helper.pid))
    with open(os.environ["DSTUI_METRICS_FILE"], "a", buffering=1) as fh:
        for s in range(1, a.steps + 1):
            if a.format == "seed":
                print(seed(s), flush=True)
            else:
                fh.write(record(s) + "\n")
            time.sleep(a.interval)
    deadline = time.time() + 120
    while a.wait_ingested and time.time() < deadline:  # the supervisor has read them: the swap comes after
        try:
            if (json.loads((run_dir / "status.json").read_text()).get("steps_done") or 0) >= a.wait_ingested:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    if not (a.once and os.path.exists(a.once)):
        if a.once:
            Path(a.once).touch()
        for entry in plan:
            apply(run_dir, Path(a.scratch or run_dir), entry, a.format)
    return a.exit


if __name__ == "__main__":
    sys.exit(main())
