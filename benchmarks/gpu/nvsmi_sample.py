#!/usr/bin/env python
"""Sample `nvidia-smi --query-gpu` every INTERVAL seconds into a CSV, stamped with the host clock.

Each row carries the unix time before and after the nvidia-smi call, so the readings
can be matched to dstui's system.jsonl (which stamps time.time()) without trusting
nvidia-smi's own local-time timestamp. Runs until killed (SIGTERM/SIGINT) or --seconds.

    python benchmarks/gpu/nvsmi_sample.py --out nvsmi.csv --interval 0.5 &
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time

FIELDS = ["index", "utilization.gpu", "memory.used", "memory.total", "power.draw"]
OPTIONAL = ["power.draw.instant", "power.draw.average"]


def query(fields: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, timeout=10,
    )  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True)
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("--seconds", type=float, default=3600.0)
    p.add_argument(
        "--apps", default=None, help="also log --query-compute-apps (pid, memory) here every 2 s"
    )
    a = p.parse_args()
    fields = list(FIELDS)
    for f in OPTIONAL:  # newer drivers only; an unknown field fails the whole query
        if query([*fields, f]).returncode == 0:
            fields.append(f)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    end = time.time() + a.seconds
    apps = open(a.apps, "w") if a.apps else None  # noqa: SIM115 - closed at exit
    if apps:
        apps.write("t,gpu_uuid,pid,process_name,used_memory_mib\n")
    last_apps = 0.0
    with open(a.out, "w") as fh:
        fh.write("t_before,t_after," + ",".join(fields) + "\n")
        while not stop and time.time() < end:
            if apps and time.time() - last_apps >= 2.0:
                last_apps = time.time()
                r = subprocess.run(
                    ["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
                     "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10,
                )  # fmt: skip
                for line in r.stdout.strip().splitlines():
                    apps.write(
                        f"{last_apps:.3f}," + ",".join(x.strip() for x in line.split(",")) + "\n"
                    )
                apps.flush()
            t0 = time.time()
            r = query(fields)
            t1 = time.time()
            if r.returncode == 0:
                for line in r.stdout.strip().splitlines():
                    fh.write(
                        f"{t0:.3f},{t1:.3f}," + ",".join(x.strip() for x in line.split(",")) + "\n"
                    )
                fh.flush()
            time.sleep(max(0.0, a.interval - (time.time() - t0)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
