"""DeepSpeed JIT ops a batch needs, built once, in parallel, before its first run starts.

Without this the first run of a batch that uses DeepSpeed's AdamW (FusedAdam on
a GPU), CPU offload (CPUAdam) or DeepCompile (the 'dc' op) builds the op inside
its timed life, and its time breakdown reads minutes of "init".
``benchmarks/gpu/validate.sh`` used to do this by hand. The builds run with
each run's own python and environment (the revision's TORCH_EXTENSIONS_DIR),
one process per op, all at once; a failed build is logged and left to the run
to report with its own reason.

Even finding an op already built costs a process that imports DeepSpeed (7.5 s
seen on an H200 host, per batch). So each build's ``.so`` is remembered in
dstui's cache (``prebuilt_ops.json``, per python, op cache folder and op) and
a later batch starts no process when every file is still there; if DeepSpeed
changed under it, torch's JIT rebuilds inside the run as it always did.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from dstui.core import paths, shm
from dstui.core.paths import RUNNERS_DIR
from dstui.core.rundir import BatchDir, write_json_atomic
from dstui.execute import launch, live_phase

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
    if not on_gpu and shm.op_wanted(settings.get("ds_overrides") or {}, {**os.environ, **(settings.get("env") or {})}):
        # DeepSpeed's CPU backend builds its shared-memory all-reduce at init_distributed; the runners
        # leave it out where no step uses it (dstui/core/shm.py), so only AutoTP runs wait for it
        ops.add("ShareMemCommBuilder")
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


def _record_file() -> Path:
    return paths.cache_dir() / "prebuilt_ops.json"


def _read_records() -> dict[str, str]:
    try:
        data = json.loads(_record_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def already_built(records: dict[str, str], python: str, cache: str, ops: set[str]) -> set[str]:
    """The ops whose remembered ``.so`` still exists (for this python and op cache folder)."""
    return {op for op in ops if (so := records.get(f"{python}|{cache}|{op}")) and Path(so).is_file()}


def remember(records: dict[str, str], python: str, cache: str, output: str) -> bool:
    """Note the ``prebuild-so: <op> <path>`` lines of a build's output; True if any was new."""
    changed = False
    for line in output.splitlines():
        if line.startswith("prebuild-so: ") and len(parts := line.split(" ", 2)) == 3:
            key = f"{python}|{cache}|{parts[1]}"
            changed |= records.get(key) != parts[2]
            records[key] = parts[2]
    return changed


def before_first_run(batch: BatchDir, *, on_gpu: bool, log: logging.Logger, timeout_s: float = 1800.0) -> None:
    """Build every op the queued runs need, one process per op, and wait for all of them.

    While they build, the runs that wait for them say so (phase ``building op X``)
    and the builds' own output goes into the first such run's stdout.log, where
    the log pane and ``dstui status`` look, instead of a silent wait.
    """
    procs = []
    records = _read_records()
    building: set[tuple[str, str, str]] = set()
    groups = plan(batch, on_gpu=on_gpu)
    for (python, cache), (_, ops) in groups.items():
        built = already_built(records, python, cache, ops)
        if built:
            log.info("DeepSpeed ops already built for %s: %s", python, ", ".join(sorted(built)))
        building |= {(python, cache, op) for op in ops - built}
    waiting = _waiting_runs(batch, {op for _, _, op in building}, on_gpu=on_gpu)
    out_file = waiting[0].log_file if waiting else None
    offset = out_file.stat().st_size if out_file is not None and out_file.exists() else 0
    for python, cache, op in sorted(building):
        env = groups[(python, cache)][0]
        log.info("building DeepSpeed op %s for %s before the first run", op, python)
        sink = open(out_file, "ab") if out_file is not None else subprocess.PIPE  # noqa: SIM115 - closed below
        procs.append((op, python, cache, sink, subprocess.Popen(
            [python, str(PREBUILD_SCRIPT), op], env=env, cwd=str(batch.path),
            stdout=sink, stderr=subprocess.STDOUT,
        )))  # fmt: skip
    for rd in waiting:
        live_phase.set_phase(rd, "building op " + ", ".join(sorted(_short(op) for _, _, op in building)))
    changed = False
    for op, python, cache, sink, proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        if sink is not subprocess.PIPE:
            sink.close()
            out = _read_from(out_file, offset)
        text = (out or b"").decode(errors="replace")
        level = logging.INFO if proc.returncode == 0 else logging.WARNING
        log.log(level, "op %s: exit %s; %s", op, proc.returncode, text.strip()[-500:])
        changed |= proc.returncode == 0 and remember(records, python, cache, text)
    for rd in waiting:
        live_phase.set_phase(rd, None)
    if changed:
        try:
            paths.cache_dir().mkdir(parents=True, exist_ok=True)
            write_json_atomic(_record_file(), records)
        except OSError as e:  # a full or read-only cache costs only the next batch's check
            log.warning("could not remember the built ops: %s", e)


def _short(op_builder: str) -> str:
    """'FusedAdamBuilder' -> 'FusedAdam': the name a user knows the op by."""
    return op_builder.removesuffix("Builder")


def _waiting_runs(batch: BatchDir, ops: set[str], *, on_gpu: bool) -> list:
    """The queued runs that need one of the ops being built (they wait for it)."""
    if not ops:
        return []
    return [rd for rd in batch.runs() if rd.state == "queued" and ops_needed(rd.settings(), on_gpu=on_gpu) & ops]


def _read_from(path: Path | None, offset: int, limit: int = 4 * 1024 * 1024) -> bytes:
    """What the builds appended to a run's log (bounded: their summary lines are at the end)."""
    if path is None:
        return b""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(offset, size - limit))
            return fh.read()
    except OSError:
        return b""
