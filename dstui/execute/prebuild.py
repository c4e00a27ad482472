"""DeepSpeed JIT ops a batch needs, built once, in parallel, before its first run starts.

Without this the first run of a batch that uses DeepSpeed's AdamW (FusedAdam on
a GPU), CPU offload (CPUAdam) or DeepCompile (the 'dc' op) builds the op inside
its timed life, and its time breakdown reads minutes of "init".
``benchmarks/gpu/validate.sh`` used to do this by hand. The builds run with
each run's own python and environment (the revision's TORCH_EXTENSIONS_DIR),
one process per op, all at once; a failed build is logged and left to the run
to report with its own reason.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any

from dstui.core.paths import RUNNERS_DIR
from dstui.core.rundir import BatchDir
from dstui.execute import launch

PREBUILD_SCRIPT = RUNNERS_DIR / "prebuild_ops.py"


def ops_needed(settings: dict[str, Any], *, on_gpu: bool) -> set[str]:
    """Op builder names (DeepSpeed's accelerator names them) that this run's settings will load."""
    if settings.get("kind", "train") == "command":
        return set()  # a user's own program: dstui does not know what it loads
    ops = set()
    ds_optimizer = not settings.get("torch_adam")
    offloaded = settings.get("offload", "none") != "none"
    if ds_optimizer and offloaded:
        ops.add("CPUAdamBuilder")
    elif ds_optimizer and on_gpu:
        ops.add("FusedAdamBuilder")
    if on_gpu and (settings.get("deepcompile") or settings.get("sp_mode") == "deepcompile"):
        ops.add("DeepCompileBuilder")
    return ops


def plan(batch: BatchDir, *, on_gpu: bool) -> dict[tuple[str, str], tuple[dict[str, str], set[str]]]:
    """(python, op cache folder) -> (environment, ops) over the batch's queued runs."""
    groups: dict[tuple[str, str], tuple[dict[str, str], set[str]]] = {}
    for rd in batch.runs():
        if rd.state != "queued":
            continue
        ops = ops_needed(rd.settings(), on_gpu=on_gpu)
        if not ops:
            continue
        rev = rd.spec().get("revision_info") or {}
        run = launch.load_runspec(rd)
        env = launch.build_env(run, rd, revision=rev)
        python = rev.get("python") or sys.executable
        key = (python, env.get("TORCH_EXTENSIONS_DIR", ""))
        groups.setdefault(key, (env, set()))[1].update(ops)
    return groups


def before_first_run(batch: BatchDir, *, on_gpu: bool, log: logging.Logger, timeout_s: float = 1800.0) -> None:
    """Build every op the queued runs need, one process per op, and wait for all of them."""
    procs = []
    for (python, _cache), (env, ops) in plan(batch, on_gpu=on_gpu).items():
        for op in sorted(ops):
            log.info("building DeepSpeed op %s for %s before the first run", op, python)
            procs.append((op, subprocess.Popen(
                [python, str(PREBUILD_SCRIPT), op], env=env, cwd=str(batch.path),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )))  # fmt: skip
    for op, proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        level = logging.INFO if proc.returncode == 0 else logging.WARNING
        log.log(level, "op %s: exit %s; %s", op, proc.returncode, (out or "").strip()[-500:])
