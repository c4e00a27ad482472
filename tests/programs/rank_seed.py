"""Every rank prints the seed's line for each step, as unbuffered Python writes it: in pieces.

``print(a, b)`` without buffering is one write per piece; here each line is four writes with a
pause between, and the ranks start together, so two ranks sharing one stream tear each
other's lines. Rank r prints loss ``10/step + r/1000`` so a test can tell whose line survived.
Usage (as a rank of ``python -m dstui.execute.injob.ranks``): rank_seed.py --local_rank=N STEPS
"""

from __future__ import annotations

import os
import sys
import time


def main() -> int:
    steps = int(sys.argv[-1])
    rank = int(os.environ.get("RANK", "0"))
    start = (int(time.time()) // 2 + 1) * 2  # the next even second: both ranks start writing together
    while time.time() < start:
        time.sleep(0.001)
    out = sys.stdout
    for s in range(1, steps + 1):
        out.write(f"Epoch 1, Step {s},")
        time.sleep(0.0005)
        out.write(f" Loss: {10.0 / s + rank / 1000:.6f}")
        out.write(" sync: True time: 0.010000")
        time.sleep(0.0005)
        out.write(" alloc_mem: 1 peak_mem: 2\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
