"""A scriptable stand-in for a training program, for supervisor fault tests.

It writes real metrics records to the file dstui gives it, at a chosen pace,
and can misbehave on purpose: garble lines, hang, crash, stay silent.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--metrics-file", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--interval", type=float, default=0.05)
    ap.add_argument("--garble", action="store_true", help="write broken lines between steps")
    ap.add_argument("--hang-after", type=int, default=0, help="sleep forever after this step")
    ap.add_argument("--hang-unless", default="", help="... unless this file exists")
    ap.add_argument("--fail-at", type=int, default=0, help="raise after this step")
    ap.add_argument("--fail-unless", default="", help="fail at --fail-at unless this file exists")
    ap.add_argument("--silent", action="store_true", help="exit 0 without any metrics")
    ap.add_argument("--hold-after", type=int, default=0, help="after this step, wait until --hold-until exists")
    ap.add_argument("--hold-until", default="", help="the file a test creates when the run may go on")
    a = ap.parse_args()
    if a.silent:
        return 0
    with open(a.metrics_file, "a", buffering=1) as fh:
        fh.write(json.dumps({"type": "header", "time": time.time(), "versions": {"fake": "1"}, "hostname": os.uname().nodename}) + "\n")
        for s in range(1, a.steps + 1):
            rec = {"type": "step", "time": time.time(), "step": s, "epoch": 1, "loss": 10.0 / s,
                   "iter_time": a.interval, "mem_peak": 1000 * s}
            fh.write(json.dumps(rec) + "\n")
            print(f"step {s}", flush=True)
            if a.garble:
                fh.write('{"type": "step", "step": ' + "\n")  # truncated
                fh.write("\x00\x01 not json at all\n")
                fh.write('{"type": "step", "step": "seven", "loss": 1}\n')
            if a.fail_at and s == a.fail_at and not (a.fail_unless and os.path.exists(a.fail_unless)):
                raise RuntimeError(f"injected failure at step {s}")
            if a.hang_after and s == a.hang_after and not (a.hang_unless and os.path.exists(a.hang_unless)):
                time.sleep(10_000)
            while a.hold_after and s == a.hold_after and not os.path.exists(a.hold_until):
                time.sleep(0.05)  # still running for as long as the test needs it, whatever the load
            time.sleep(a.interval)
        fh.write(json.dumps({"type": "summary", "time": time.time(), "steps": a.steps, "status": "ok"}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
