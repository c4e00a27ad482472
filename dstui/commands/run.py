"""`dstui run SPEC`: validate everything, lay out run folders, hand them to a detached supervisor.

The supervisor runs in its own session, so closing the terminal (or losing the
SSH connection) does not stop the batch; this command only follows it.
"""

from __future__ import annotations

import argparse
import os
import sys

from dstui.analysis import forecast
from dstui.commands import _argtypes, _machine
from dstui.commands._follow_out import follow
from dstui.commands._records import batch_record, plan_record
from dstui.core import executors, startup_trace
from dstui.core.rundir import BatchDir
from dstui.usecases import launch
from dstui.usecases.options import NEWEST, LaunchOptions


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", nargs="?", help="experiment spec (YAML)")
    p.add_argument("--dry-run", action="store_true", help="print the exact commands; launch nothing")
    p.add_argument(
        "--parallel",
        type=_argtypes.count(0, " (0 = auto)"),
        default=0,
        metavar="N",
        help="runs at a time, each on its own GPUs (default 0 = auto: as many as fit on "
        "disjoint GPUs of this box; one at a time without GPUs or when DeepSpeed's launcher "
        "places the ranks; 1 = one after another)",
    )
    p.add_argument(
        "--resume",
        nargs="?",
        const=NEWEST,
        metavar="BATCH",
        help="continue a batch of this spec (BATCH: its id or folder; default the newest): keep finished "
        "runs with the same key, re-run failed/killed/missing ones",
    )
    p.add_argument(
        "--only",
        nargs="+",
        metavar="PATTERN",
        help="run only these runs or conditions (names or shell patterns, e.g. z3-dc 'z1-*'); "
        "with --resume the batch keeps its other runs as they are",
    )
    slurm = p.add_argument_group("Slurm (each run is one job; see docs/CLUSTERS.md)")
    slurm.add_argument(
        "--executor",
        choices=executors.names(),  # the registry's: built-in ones and those of $DSTUI_EXECUTORS
        help="where runs start: this machine (local, the default), one Slurm job each (slurm), or another "
        "registered executor; overrides the spec's 'executor'",
    )
    slurm.add_argument("--partition", help="sbatch --partition (spec: slurm.partition)")
    slurm.add_argument("--account", help="sbatch --account (spec: slurm.account)")
    slurm.add_argument("--time-limit", metavar="T", help="per job, e.g. 30m, 2h, 1-00:00:00 (spec: slurm.time_limit)")
    slurm.add_argument(
        "--max-jobs", type=_argtypes.count(1), metavar="N", help="at most N jobs pending or running at once (default: all; --parallel is for local runs)"
    )
    p.add_argument(
        "--skip-predicted-oom",
        action="store_true",
        help="do not launch runs whose memory forecast exceeds the GPU's memory (or the spec's "
        "gpu_memory_gib); they end as 'skipped: predicted OOM (X GiB > Y GiB)'. Same as "
        "skip_predicted_oom: true in the spec",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="launch runs that cannot work on this machine (DeepCompile without a GPU, more "
        "ranks than GPUs or cores, a forecast over the GPU's memory); without it such runs "
        "are refused, one line each, before anything is built",
    )
    p.add_argument(
        "--overlap",
        action="store_true",
        help="start runs even while other batches' runs use this machine's cores (default: wait for them); "
        "what ran beside each run is recorded, and reports leave timings taken under overlap out of speed "
        "comparisons (dstui report --include-overlapped keeps them)",
    )
    p.add_argument("--detach", action="store_true", help="return at once; runs go on in the background")
    p.add_argument("--no-validate", action="store_true", help="skip DeepSpeed's config validation")
    p.add_argument("--quiet", action="store_true", help="only print the final table")
    add_output_arguments(p)


def add_output_arguments(p: argparse.ArgumentParser) -> None:
    """--json / --jsonl: what scripts read (stdout holds only JSON; messages for people go to stderr)."""
    out = p.add_mutually_exclusive_group()
    out.add_argument(
        "--json", action="store_true",
        help="print one JSON document when the batch ends: every run's state, step, reason, metrics",
    )  # fmt: skip
    out.add_argument(
        "--jsonl", action="store_true",
        help="stream JSON Lines: a record per run change (event: run), per batch note (event: note), "
        "and the whole batch at the end (event: batch)",
    )  # fmt: skip


def resume_target(args: argparse.Namespace) -> str | None:
    """The batch ``--resume`` names (None: the newest of the spec); fixes ``--resume SPEC`` taken as BATCH."""
    if args.resume and args.spec is None:  # `dstui run --resume SPEC`: argparse gave the spec to --resume
        args.spec, args.resume = args.resume, NEWEST
    return None if args.resume in (None, NEWEST) else args.resume


def _mark(name: str) -> None:
    startup_trace.mark(name, "cli")


def options_of(args: argparse.Namespace) -> LaunchOptions:
    """The flags as the launch service's options (the TUI passes the same object, with its defaults)."""
    overrides = {"partition": args.partition, "account": args.account, "time_limit": args.time_limit, "max_jobs": args.max_jobs}
    return LaunchOptions(
        parallel=args.parallel, force=args.force, skip_predicted_oom=args.skip_predicted_oom,
        validate=not args.no_validate, only=args.only, executor=args.executor, slurm=overrides, resume=args.resume,
        overlap=args.overlap,
    )  # fmt: skip


def _say(kind: str, text: str) -> None:
    print(f"! {text}" if kind == "note" else text, flush=True)


def run(args: argparse.Namespace) -> int:
    _mark("cli_run")  # the interpreter's start, dstui's and this command's imports are before it
    resume_target(args)
    if args.spec is None:
        print("dstui: error: the following arguments are required: spec", file=sys.stderr)
        return 2
    # the memory forecast asks MLflow for history: an unreachable server must cost seconds, not minutes
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    options = options_of(args)
    plan = launch.dry_plan(args.spec, options) if args.dry_run else launch.make_plan(args.spec, options)
    _mark("plan_done")
    # the backend's preflight (not for --dry-run: nothing is submitted), the forecast, what cannot work here
    prepared = launch.check(plan, options, dry_run=args.dry_run)
    for p in prepared.forced:
        print(f"! --force: launching anyway: {p.line()}", file=sys.stderr, flush=True)
    if args.dry_run:
        return dry_run(prepared)
    started = launch.start(prepared, options, say=_say)
    b = started.batch
    if args.detach:
        print("runs go on in the background; watch with `dstui status` or `dstui`")
        return detached_output(b, _machine.wants(args))
    return follow(b, quiet=args.quiet, fmt=_machine.wants(args), verbose=getattr(args, "verbose", False))


def dry_run(prepared: launch.Prepared) -> int:
    """--dry-run: what would start for each run (the command, or the job script), its memory forecast."""
    capacity = prepared.capacity
    shown = launch.previews(prepared)
    for r, preview in shown:
        fc = prepared.forecasts.get(r.name)
        mem = f"  memory/GPU {forecast.column(fc, capacity)} ({fc.source})" if fc else ""
        oom = forecast.oom_reason(fc, capacity) if prepared.skip_oom else None
        print(f"# {r.name}  (key {r.key}){mem}" + (f"  -> {oom}" if oom else ""))
        print(preview.text)
    print(f"# {forecast.capacity_note(capacity)}")
    for rev in prepared.plan.revisions.values():  # looked up, not built (the launch builds what is missing)
        how = "cached" if rev.get("cached") else f"not built yet: the launch builds it ({rev.get('install')}: {rev.get('install_reason')})"
        print(f"# revision {rev['name']} ({rev['kind']} {rev['requested']}): {rev['python']}, {how}")
    print(f"# {len(prepared.runs)} runs; nothing launched (--dry-run); master ports are chosen free at launch")
    if _machine.active():  # --json: the planned runs and their exact commands (as shown: secrets masked)
        runs = [plan_record(r, prepared.forecasts.get(r.name), capacity, command=list(preview.command))
                for r, preview in shown]  # fmt: skip
        _machine.emit({"experiment": prepared.spec.name, "dry_run": True, "runs": runs})
    return 0


def detached_output(b: BatchDir, fmt: str | None) -> int:
    """--detach with --json/--jsonl: the batch as it starts (its runs queued)."""
    if fmt is not None:
        _machine.emit(batch_record(b), one_line=fmt == "jsonl")
    return 0
