"""Time to first frame of `dstui` (the TUI) in a fresh process, under a real pseudo-terminal.

The app writes a marker file (DSTUI_TUI_READY_FILE) right after its first
refresh; we time from spawning `python -m dstui` to that file appearing.
Goal: < 1 s on the 2-core dev machine. Run: python benchmarks/tui_startup.py [-n 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tui_pty import PtyApp  # noqa: E402


def one(home: Path, i: int) -> float:
    marker = home / f"ready-{i}"
    env = {**os.environ, "DSTUI_HOME": str(home), "DSTUI_TUI_READY_FILE": str(marker),
           "MLFLOW_TRACKING_URI": f"sqlite:///{home}/mlflow.db"}  # fmt: skip
    t0 = time.perf_counter()
    app = PtyApp([], env)
    try:
        while not marker.exists():
            if app.proc.poll() is not None:
                raise RuntimeError(f"dstui exited early: {bytes(app.output)[-2000:]!r}")
            if time.perf_counter() - t0 > 30:
                raise RuntimeError("no first frame within 30 s")
            time.sleep(0.002)
        return time.perf_counter() - t0
    finally:
        app.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-n", type=int, default=7, help="runs (the first is reported apart: cold caches)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        times = [one(home, i) for i in range(args.n)]
    warm = times[1:] or times
    print(f"dstui first frame: cold {times[0]:.3f} s; warm median {statistics.median(warm):.3f} s "
          f"(min {min(warm):.3f}, max {max(warm):.3f}, n={len(warm)}); goal < 1 s")  # fmt: skip
    return 0 if statistics.median(warm) < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
