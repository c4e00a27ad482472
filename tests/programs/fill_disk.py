"""A job that dies of a full disk without a word: the disk-full test's stand-in (issue 33.4).

It writes two steps, fills the disk (a filler file, then its own stdout.log to the
last byte, so not even a traceback fits), and exits 1. Only what its wrapper
recorded can tell why it ended.
"""

from __future__ import annotations

import json
import os
import sys
import time


def fill(fd: int) -> None:
    """Write to ``fd`` until the disk refuses even one more byte."""
    for size in (1 << 16, 1 << 10, 1):
        while True:
            try:
                os.write(fd, b"x" * size)
            except OSError:
                break


def main() -> int:
    metrics, filler = sys.argv[1], sys.argv[2]
    with open(metrics, "a") as fh:
        for s in (1, 2):
            fh.write(json.dumps({"type": "step", "time": time.time(), "step": s, "loss": 1.0 / s}) + "\n")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    fill(fd)
    fill(1)  # stdout: stdout.log, on the same disk
    os._exit(1)  # no flush, no traceback: nothing more could be written anyway


if __name__ == "__main__":
    sys.exit(main())
