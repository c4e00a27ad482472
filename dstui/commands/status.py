"""`dstui status [BATCH]`: batches and runs, read from their folders.

Also takes over any unfinished batch whose supervisor died, so metrics
ingestion resumes where it stopped.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from dstui.commands._common import batch_notes, runs_table
from dstui.core import paths, phases
from dstui.core.errors import DstuiError
from dstui.core.records import bad_lines_note
from dstui.core.rundir import BatchDir, RunDir, list_batches
from dstui.execute import supervisor


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("batch", nargs="?", help="batch id or folder (default: the newest batches)")
    p.add_argument("-n", type=int, default=3, help="how many recent batches to show (default 3)")
    p.add_argument("--no-takeover", action="store_true", help="do not restart dead supervisors")


def run(args: argparse.Namespace) -> int:
    root = paths.runs_dir()
    if args.batch:
        b = BatchDir((root / args.batch) if (root / args.batch).is_dir() else Path(args.batch))
        if not b.batch_file.exists():
            raise DstuiError(f"no batch '{args.batch}' under {root}")
        batches = [b]
    else:
        batches = list_batches(root)[: args.n]
    if not batches:
        print(f"no batches under {root}; start one with `dstui run SPEC` or `dstui demo`")
        return 0
    for b in batches:
        info = b.info()
        live = supervisor.is_supervised(b)
        note = "supervised" if live else ("finished" if info.get("finalized") else "supervisor not running")
        if not live and not info.get("finalized") and not args.no_takeover:
            supervisor.spawn(b)
            note = "supervisor restarted (took over)"
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(info.get("created", 0)))
        print(f"{b.id}  [{info.get('experiment')}]  created {created}  {note}")
        for line in batch_notes(info, b.path):
            print(f"  ! {line}")
        print(runs_table(b))
        for line in time_lines(b.runs()):
            print(line)
        print()
    return 0


def time_lines(runs: list[RunDir]) -> list[str]:
    """Which GPUs each live run holds, where each finished run's time went, and the batch's step share."""
    lines = []
    statuses = [rd.status() for rd in runs]
    for rd, st in zip(runs, statuses, strict=True):
        if st.get("gpu_slice") and st.get("state") in ("starting", "running"):
            lines.append(f"  gpus  {rd.name}: {','.join(str(g) for g in st['gpu_slice'])}")
        times = phases.from_status(st)
        if times is not None:
            lines.append(f"  time  {rd.name}: {times.line()}")
        bad = bad_lines_note(st)
        if bad:
            lines.append(f"  bad   {rd.name}: {bad}")
        caches = phases.compile_cache_line(st.get("summary"))
        if caches:
            lines.append(f"  cache {rd.name}: {caches}")
    share = phases.batch_step_share(statuses)
    if share is not None:
        lines.append(
            f"  step share {share[0]:.0%}: {share[1]:.1f} s of optimizer steps in {share[2]:.1f} s of wall time"
        )
    return lines
