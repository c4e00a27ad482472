"""`dstui run SPEC`: validate everything, lay out run folders, hand them to a detached supervisor.

The supervisor runs in its own session, so closing the terminal (or losing the
SSH connection) does not stop the batch; this command only follows it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from dstui.analysis import forecast
from dstui.commands import _argtypes, _machine
from dstui.commands._common import batch_notes
from dstui.commands._follow_out import FollowOutput
from dstui.commands._records import batch_record, plan_record
from dstui.core import executors, failures, startup_trace
from dstui.core.rundir import FINAL_STATES, BatchDir, RunDir
from dstui.execute import backends, batch, core_share, feasibility, supervisor, sysmetrics
from dstui.execute.ingest import unsent_points


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


NEWEST = "newest"  # `--resume` without a batch


def resume_target(args: argparse.Namespace) -> str | None:
    """The batch ``--resume`` names (None: the newest of the spec); fixes ``--resume SPEC`` taken as BATCH."""
    if args.resume and args.spec is None:  # `dstui run --resume SPEC`: argparse gave the spec to --resume
        args.spec, args.resume = args.resume, NEWEST
    return None if args.resume in (None, NEWEST) else args.resume


def _mark(name: str) -> None:
    startup_trace.mark(name, "cli")


def run(args: argparse.Namespace) -> int:
    _mark("cli_run")  # the interpreter's start, dstui's and this command's imports are before it
    resume_batch = resume_target(args)
    if args.spec is None:
        print("dstui: error: the following arguments are required: spec", file=sys.stderr)
        return 2
    # the memory forecast asks MLflow for history: an unreachable server must cost seconds, not minutes
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    overrides = {"partition": args.partition, "account": args.account, "time_limit": args.time_limit, "max_jobs": args.max_jobs}
    plan = batch.plan(args.spec, validate=not args.no_validate, only=args.only, executor=args.executor, slurm=overrides)
    _mark("plan_done")
    backend = backends.get(plan.spec.executor)
    if not args.dry_run:
        backend.preflight(plan)  # what it would refuse (Slurm: sbatch --test-only), before any folder or job exists
    forecasts, capacity = forecast.for_plan(plan, sysmetrics.gpu_memory_total())
    _mark("forecast_done")
    skip = args.skip_predicted_oom or plan.spec.skip_predicted_oom
    # the same check as Compose's and the TUI's launch: one line per run that cannot work here
    for p in feasibility.refuse_infeasible(plan, force=args.force, forecasts=forecasts, capacity=capacity,
                                           skip_predicted_oom=skip):  # fmt: skip
        print(f"! --force: launching anyway: {p.line()}", file=sys.stderr, flush=True)
    _mark("feasibility_done")
    if args.dry_run:
        for r in plan.runs:
            rd = batch.RunDir(batch.paths.runs_dir() / "<batch>" / r.name)
            fc = forecasts.get(r.name)
            mem = f"  memory/GPU {forecast.column(fc, capacity)} ({fc.source})" if fc else ""
            oom = forecast.oom_reason(fc, capacity) if skip else None
            print(f"# {r.name}  (key {r.key}){mem}" + (f"  -> {oom}" if oom else ""))
            print(backend.preview(plan, r, rd).text)  # the command, or the job script it would submit
        print(f"# {forecast.capacity_note(capacity)}")
        print(f"# {len(plan.runs)} runs; nothing launched (--dry-run); master ports are chosen free at launch")
        return dry_run_output(plan, forecasts, capacity)
    if args.resume:
        b, counts = batch.resume(plan, parallel=args.parallel, partial=bool(args.only), batch_ref=resume_batch)
        print(f"resuming batch {b.id}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    else:
        b = batch.create(plan, parallel=args.parallel)
        print(f"batch {b.id}: {len(plan.runs)} runs in {b.path}")
    _mark("batch_created")
    if skip:
        skip_predicted_oom(b, forecasts, capacity)
    if args.overlap:
        core_share.allow_overlap(b)
    for note in gpu_notes(b):
        print(f"! {note}", flush=True)
    _mark("gpu_notes_done")
    supervisor.spawn(b)
    _mark("supervisor_up")
    if args.detach:
        print("runs go on in the background; watch with `dstui status` or `dstui`")
        return detached_output(b, _machine.wants(args))
    return follow(b, quiet=args.quiet, fmt=_machine.wants(args), verbose=getattr(args, "verbose", False))


def dry_run_output(plan: batch.Plan, forecasts: dict, capacity: int | None) -> int:
    """--dry-run with --json: the planned runs and their exact commands (as shown: secrets masked)."""
    if _machine.active():
        root = batch.paths.runs_dir() / "<batch>"
        backend = backends.get(plan.spec.executor)
        runs = []
        for r in plan.runs:
            argv = backend.preview(plan, r, batch.RunDir(root / r.name)).command
            runs.append(plan_record(r, forecasts.get(r.name), capacity, command=list(argv)))
        _machine.emit({"experiment": plan.spec.name, "dry_run": True, "runs": runs})
    return 0


def detached_output(b: BatchDir, fmt: str | None) -> int:
    """--detach with --json/--jsonl: the batch as it starts (its runs queued)."""
    if fmt is not None:
        _machine.emit(batch_record(b), one_line=fmt == "jsonl")
    return 0


def gpu_notes(b: BatchDir) -> list[str]:
    """What the batch's backend says before its runs start (other batches hold this machine's GPUs, ...)."""
    return backends.get(b.info().get("executor")).launch_notes(b)


def skip_predicted_oom(b: BatchDir, forecasts: dict, capacity: int | None) -> None:
    """Mark queued runs whose forecast exceeds the GPU as skipped, before the supervisor sees them."""
    for name, fc in forecasts.items():
        rd = RunDir(b.path / name)
        reason = forecast.oom_reason(fc, capacity)
        if reason and rd.state == "queued":
            rd.update_status(state="skipped", reason=reason, ended=time.time())
            print(f"{name}: {reason}", flush=True)


def nap(path: os.PathLike[str] | str, seconds: float, *, tick_s: float = 0.05) -> None:
    """Sleep up to ``seconds``, waking early when ``path`` changes.

    ``path`` is batch.json: the supervisor rewrites it when the batch is
    finalized (and for a note), so `dstui run` returns within a tick of the
    batch's end instead of up to a whole poll later. One stat a tick.
    """

    def stamp() -> tuple[int, int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    before = stamp()
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(tick_s, left))
        if stamp() != before:
            return


def all_steps_done(st: dict) -> bool:
    """A running run whose last step is logged (its teardown and exit come next)."""
    done, total = st.get("steps_done"), st.get("steps_total")
    return st.get("state") == "running" and isinstance(done, int) and isinstance(total, int) and 0 < total <= done


def trouble_line(name: str, st: dict) -> str | None:
    """'FAILED a-r0: reason' (printed as '! FAILED ...') for a run that failed, was killed, hung or was flagged by the guard."""
    t = failures.trouble(st)
    return f"{t.kind.upper()} {name}: {t.text}" if t else None


FINALIZE_WAIT_S = 15.0  # after the last run ends, how long to wait for an unreachable MLflow
FINALIZE_MAX_S = 300.0  # ... and for a reachable one still taking the last points and artifacts
MAX_TAKEOVERS = 3  # a supervisor that keeps dying is reported, not restarted forever
FAST_FOR_S = 10.0  # after a run's last step, how long to follow at the short interval


def follow(b: BatchDir, *, quiet: bool = False, poll_s: float = 0.5, fmt: str | None = None, verbose: bool = False) -> int:
    """Print progress until every run has ended; Ctrl-C leaves the runs going.

    Returns once the runs have ended even if MLflow has not taken every point
    yet: the supervisor keeps sending in the background, and the summary says
    how many points still wait. What is printed, per format (people, json,
    jsonl), is :class:`~dstui.commands._follow_out.FollowOutput`'s.
    """
    out = FollowOutput(b, fmt, quiet=quiet, verbose=verbose)
    seen: dict[str, tuple] = {}
    notes_seen: set[str] = set()
    last_print = 0.0
    ended_at: float | None = None
    takeovers = 0
    try:
        while True:
            runs = b.runs()
            now = time.time()
            finishing = False
            for rd in runs:
                st = rd.status()
                # its last step is logged (status.json's last_step_at says when): teardown and exit next
                finishing |= supervisor.is_finishing(st) or (
                    all_steps_done(st) and now - float(st.get("last_step_at") or 0.0) < FAST_FOR_S
                )
                key = (st.get("state"), st.get("reason"), bool(st.get("diverged")), st.get("phase"))
                step_due = st.get("state") == "running" and now - last_print > 5
                if seen.get(rd.name) != key or step_due:
                    out.run_changed(rd, st)
                    alarm = trouble_line(rd.name, st)
                    if alarm and (seen.get(rd.name) or (None,))[:3] != key[:3]:
                        out.note(alarm)  # the moment it happens, not only in the final table
                    seen[rd.name] = key
            if any(rd.state == "running" for rd in runs) and now - last_print > 5:
                last_print = now
            info = b.info()
            for note in batch_notes(info, b.path):
                if note not in notes_seen:  # each problem once
                    notes_seen.add(note)
                    out.note(note)
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
                        out.note(f"the supervisor stopped {takeovers + 1} times; see {b.log_file}")
                        break
                    takeovers += 1
                    print("supervisor is gone; taking over", flush=True)
                    supervisor.spawn(b)
            # a run past its last step, or every run ended: the reap and the supervisor's finalizing take a
            # fraction of a second; don't add a whole poll to the command's wall (issue 31)
            nap(b.batch_file, min(poll_s, 0.2) if ended_at or finishing else poll_s)
    except KeyboardInterrupt:
        print(f"\nstopped following; the runs go on. `dstui status {b.id}` to look again, "
              f"`dstui cancel {b.id}` to stop them.")  # fmt: skip
        return 130
    _mark("end_seen")
    waiting = None if b.info().get("finalized") else sum(unsent_points(rd) for rd in b.runs())
    code = out.finish(waiting)
    _mark("final_table_printed")
    return code
