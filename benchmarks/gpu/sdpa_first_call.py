#!/usr/bin/env python
"""What one process's first cuDNN attention call costs, and on what it depends (issue 31).

On the lent H100 (torch 2.11, cuDNN 9, CUDA 13) the first ``scaled_dot_product_attention``
forward+backward in a process runs NVRTC to build cuDNN's fused attention kernels, and the
result is kept in the CUDA JIT cache (~/.nv/ComputeCache) for later processes. This prints, as
one JSON line: the working directory, the first and the second call's time (synchronized), and
how many files the JIT cache held before and after. benchmarks/gpu/diag_cwd.sh starts it in
chosen folders, with chosen arguments and environments, to see what a later process must share
with an earlier one to find its kernels in the cache.

    python benchmarks/gpu/sdpa_first_call.py [ANY EXTRA ARGUMENTS ARE IGNORED]
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time


def jit_cache() -> dict[str, object]:
    """The CUDA driver's JIT cache (kept across processes): its folder, files and bytes."""
    root = os.environ.get("CUDA_CACHE_PATH") or os.path.expanduser("~/.nv/ComputeCache")
    files = size = 0
    for folder, _dirs, names in os.walk(root):
        for n in names:
            files += 1
            with contextlib.suppress(OSError):
                size += os.path.getsize(os.path.join(folder, n))
    return {"path": root, "files": files, "bytes": size}


def first_calls(device: str = "cuda") -> tuple[float, float]:
    """Seconds of one SDPA forward+backward of fixed (llama-1b) shapes, twice: the first call's set-up, then none."""
    import torch

    times = []
    for _ in range(2):
        q, k, v = (torch.randn(4, 32, 2048, 64, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(round(time.perf_counter() - t, 3))
    return times[0], times[1]


def main() -> int:
    before = jit_cache()["files"]
    first, second = first_calls()
    print(json.dumps({"cwd": os.getcwd(), "argv": sys.argv[1:], "first_s": first, "second_s": second,
                      "jit_cache_files": [before, jit_cache()["files"]]}), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
