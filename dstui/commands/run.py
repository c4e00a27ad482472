"""`dstui run SPEC`: validate everything, lay out run folders, hand them to a detached supervisor.

The supervisor runs in its own session, so closing the terminal (or losing the
SSH connection) does not stop the batch; this command only follows it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

from dstui.analysis import forecast
from dstui.commands._common import batch_notes, run_row, runs_table
from dstui.core.rundir import FINAL_STATES, BatchDir, RunDir
from dstui.core.secrets import strip_credentials
from dstui.execute import batch, launch, slurm, slurm_script, supervisor, sysmetrics
from dstui.execute.ingest import unsent_points


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", nargs="?", help="experiment spec (YAML)")
    p.add_argument("--dry-run", action="store_true", help="print the exact commands; launch nothing")
    p.add_argument(
        "--parallel",
        type=int,
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
        choices=("local", "slurm"),
        help="where runs start: this machine (default) or one Slurm job each; overrides the spec's 'executor'",
    )
    slurm.add_argument("--partition", help="sbatch --partition (spec: slurm.partition)")
    slurm.add_argument("--account", help="sbatch --account (spec: slurm.account)")
    slurm.add_argument("--time-limit", metavar="T", help="per job, e.g. 30m, 2h, 1-00:00:00 (spec: slurm.time_limit)")
    slurm.add_argument(
        "--max-jobs", type=int, metavar="N", help="at most N jobs pending or running at once (default: all; --parallel is for local runs)"
    )
    p.add_argument(
        "--skip-predicted-oom",
        action="store_true",
        help="do not launch runs whose memory forecast exceeds the GPU's memory (or the spec's "
        "gpu_memory_gib); they end as 'skipped: predicted OOM (X GiB > Y GiB)'. Same as "
        "skip_predicted_oom: true in the spec",
    )
    p.add_argument("--detach", action="store_true", help="return at once; runs go on in the background")
    p.add_argument("--no-validate", action="store_true", help="skip DeepSpeed's config validation")
    p.add_argument("--quiet", action="store_true", help="only print the final table")


NEWEST = "newest"  # `--resume` without a batch


def resume_target(args: argparse.Namespace) -> str | None:
    """The batch ``--resume`` names (None: the newest of the spec); fixes ``--resume SPEC`` taken as BATCH."""
    if args.resume and args.spec is None:  # `dstui run --resume SPEC`: argparse gave the spec to --resume
        args.spec, args.resume = args.resume, NEWEST
    return None if args.resume in (None, NEWEST) else args.resume


def run(args: argparse.Namespace) -> int:
    resume_batch = resume_target(args)
    if args.spec is None:
        print("dstui: error: the following arguments are required: spec", file=sys.stderr)
        return 2
    if args.parallel < 0:
        print("dstui: error: --parallel must be 0 (auto) or more", file=sys.stderr)
        return 2
    # the memory forecast asks MLflow for history: an unreachable server must cost seconds, not minutes
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    overrides = {"partition": args.partition, "account": args.account, "time_limit": args.time_limit, "max_jobs": args.max_jobs}
    plan = batch.plan(args.spec, validate=not args.no_validate, only=args.only, executor=args.executor, slurm=overrides)
    if plan.spec.executor == "slurm":
        if args.dry_run:
            return print_job_scripts(plan)
        slurm.preflight(plan.runs, plan.spec.slurm, plan.revisions)  # before any folder or job exists
    forecasts, capacity = forecast.for_plan(plan, sysmetrics.gpu_memory_total())
    skip = args.skip_predicted_oom or plan.spec.skip_predicted_oom
    if args.dry_run:
        for r in plan.runs:
            rd = batch.RunDir(batch.paths.runs_dir() / "<batch>" / r.name)
            python = (plan.revisions.get(r.revision) or {}).get("python")
            fc = forecasts.get(r.name)
            mem = f"  memory/GPU {forecast.column(fc, capacity)} ({fc.source})" if fc else ""
            oom = forecast.oom_reason(fc, capacity) if skip else None
            print(f"# {r.name}  (key {r.key}){mem}" + (f"  -> {oom}" if oom else ""))
            print(shlex.join(launch.shown_command(r, launch.build_argv(r, rd, python=python))))
        print(f"# {forecast.capacity_note(capacity)}")
        print(f"# {len(plan.runs)} runs; nothing launched (--dry-run); master ports are chosen free at launch")
        return 0
    if args.resume:
        b, counts = batch.resume(plan, parallel=args.parallel, partial=bool(args.only), batch_ref=resume_batch)
        print(f"resuming batch {b.id}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    else:
        b = batch.create(plan, parallel=args.parallel)
        print(f"batch {b.id}: {len(plan.runs)} runs in {b.path}")
    if skip:
        skip_predicted_oom(b, forecasts, capacity)
    supervisor.spawn(b)
    if args.detach:
        print("runs go on in the background; watch with `dstui status` or `dstui`")
        return 0
    return follow(b, quiet=args.quiet)


def print_job_scripts(plan: batch.Plan) -> int:
    """--dry-run under Slurm: each run's job script, as it would be written to its folder."""
    root = batch.paths.runs_dir() / "<batch>"
    for r in plan.runs:
        rd = batch.RunDir(root / r.name)
        rev = plan.revisions.get(r.revision) or {}
        cwd = None if r.settings.kind != "command" else os.getcwd()
        print(f"# ---- {rd.path / slurm_script.SCRIPT_NAME}  (key {r.key})")
        print(slurm_script.job_script(r, rd, plan.spec.slurm, port=29500, python=rev.get("python"), revision=rev, cwd=cwd))
    print(f"# {len(plan.runs)} Slurm jobs; nothing submitted (--dry-run); master ports are chosen free at submission")
    return 0


def skip_predicted_oom(b: BatchDir, forecasts: dict, capacity: int | None) -> None:
    """Mark queued runs whose forecast exceeds the GPU as skipped, before the supervisor sees them."""
    for name, fc in forecasts.items():
        rd = RunDir(b.path / name)
        reason = forecast.oom_reason(fc, capacity)
        if reason and rd.state == "queued":
            rd.update_status(state="skipped", reason=reason, ended=time.time())
            print(f"{name}: {reason}", flush=True)


FINALIZE_WAIT_S = 15.0  # after the last run ends, how long to wait for an unreachable MLflow
FINALIZE_MAX_S = 300.0  # ... and for a reachable one still taking the last points and artifacts
MAX_TAKEOVERS = 3  # a supervisor that keeps dying is reported, not restarted forever


def follow(b: BatchDir, *, quiet: bool = False, poll_s: float = 1.0) -> int:
    """Print progress until every run has ended; Ctrl-C leaves the runs going.

    Returns once the runs have ended even if MLflow has not taken every point
    yet: the supervisor keeps sending in the background, and the summary says
    how many points still wait.
    """
    seen: dict[str, tuple] = {}
    notes_seen: set[str] = set()
    last_print = 0.0
    ended_at: float | None = None
    takeovers = 0
    try:
        while True:
            runs = b.runs()
            now = time.time()
            for rd in runs:
                st = rd.status()
                key = (st.get("state"), st.get("reason"), bool(st.get("diverged")))
                step_due = st.get("state") == "running" and now - last_print > 5
                if not quiet and (seen.get(rd.name) != key or step_due):
                    row = run_row(rd)
                    print("  ".join(x for x in row if x and x != "-"), flush=True)
                    seen[rd.name] = key
            if not quiet and any(rd.state == "running" for rd in runs) and now - last_print > 5:
                last_print = now
            info = b.info()
            for note in batch_notes(info, b.path):
                if note not in notes_seen:  # each problem once
                    notes_seen.add(note)
                    print(f"! {note}", flush=True)
            if all(rd.state in FINAL_STATES for rd in runs):
                if info.get("finalized"):
                    break
                ended_at = ended_at or now
                # MLflow known to be down: say what waits and return; else let it finish sending
                limit = FINALIZE_WAIT_S if info.get("tracking_problem") else FINALIZE_MAX_S
                if now - ended_at > limit:
                    break
            if not supervisor.is_supervised(b) and not info.get("finalized"):
                time.sleep(1.0)  # it may be starting up
                if not supervisor.is_supervised(b) and not b.info().get("finalized"):
                    if takeovers >= MAX_TAKEOVERS:
                        print(f"! the supervisor stopped {takeovers + 1} times; see {b.log_file}", flush=True)
                        break
                    takeovers += 1
                    print("supervisor is gone; taking over", flush=True)
                    supervisor.spawn(b)
            time.sleep(poll_s)
    except KeyboardInterrupt:
        print(f"\nstopped following; the runs go on. `dstui status {b.id}` to look again, "
              f"`dstui cancel RUN` to stop one.")  # fmt: skip
        return 130
    runs = b.runs()
    print()
    print(runs_table(b))
    failed = [rd for rd in runs if rd.state not in ("done", "skipped")]
    print(f"\n{len(runs) - len(failed)}/{len(runs)} runs done; MLflow: {strip_credentials(b.info().get('tracking_uri') or '')}")
    if not b.info().get("finalized"):
        waiting = sum(unsent_points(rd) for rd in runs)
        print(f"{waiting} points still wait for MLflow; they stay in the run folders and are sent "
              f"when it answers (`dstui status {b.id}`)")  # fmt: skip
    return 1 if failed else 0
