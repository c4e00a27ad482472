#!/usr/bin/env python
"""Build (or load from the cache) DeepSpeed JIT ops before a batch's first run: `prebuild_ops.py FusedAdamBuilder ...`.

Started by dstui's supervisor once per op and revision environment, all at
once, before the first run of a batch (dstui/execute/prebuild.py): a build
then never lands inside a timed run, and two runs never wait on each other's
build lock. Uses the same op-cache folder as the runners (common.isolate_op_cache).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import common


def main(names: list[str]) -> int:
    common.isolate_op_cache()
    common.clear_stale_op_locks()
    from deepspeed.accelerator import get_accelerator

    accel = get_accelerator()
    code = 0
    for name in names:
        t0 = time.monotonic()
        try:
            builder = accel.create_op_builder(name)
            if builder is None or not builder.is_compatible(verbose=False):
                print(f"prebuild: {name}: not available on {accel.device_name()}; skipped", flush=True)
                continue
            builder.load(verbose=True)  # the compiler's lines reach the run's log while it builds
        except Exception as e:  # noqa: BLE001 - the run itself will report the build failure
            print(f"prebuild: {name}: failed: {e}", flush=True)
            code = 1
            continue
        print(f"prebuild: {name}: ready in {time.monotonic() - t0:.1f} s", flush=True)
        root = os.environ.get("TORCH_EXTENSIONS_DIR")
        if root:  # where torch's JIT keeps it: the supervisor checks this file next time, without a process
            print(f"prebuild-so: {name} {Path(root) / builder.name / (builder.name + '.so')}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
