"""`dstui run SPEC`: validate everything, lay out run folders, hand them to a detached supervisor.

The supervisor runs in its own session, so closing the terminal (or losing the
SSH connection) does not stop the batch; this command only follows it.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time

from dstui.commands._common import RUN_HEADER, run_row, table
from dstui.core.rundir import FINAL_STATES, BatchDir
from dstui.execute import batch, launch, supervisor


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="experiment spec (YAML)")
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
        action="store_true",
        help="continue the newest batch of this spec: keep finished runs with the same key, "
        "re-run failed/killed/missing ones",
    )
    p.add_argument(
        "--only",
        nargs="+",
        metavar="PATTERN",
        help="run only these runs or conditions (names or shell patterns, e.g. z3-dc 'z1-*'); "
        "with --resume the batch keeps its other runs as they are",
    )
    p.add_argument("--detach", action="store_true", help="return at once; runs go on in the background")
    p.add_argument("--no-validate", action="store_true", help="skip DeepSpeed's config validation")
    p.add_argument("--quiet", action="store_true", help="only print the final table")


def run(args: argparse.Namespace) -> int:
    if args.parallel < 0:
        print("dstui: error: --parallel must be 0 (auto) or more", file=sys.stderr)
        return 2
    plan = batch.plan(args.spec, validate=not args.no_validate, only=args.only)
    if args.dry_run:
        for r in plan.runs:
            rd = batch.RunDir(batch.paths.runs_dir() / "<batch>" / r.name)
            python = (plan.revisions.get(r.revision) or {}).get("python")
            print(f"# {r.name}  (key {r.key})")
            print(shlex.join(launch.build_argv(r, rd, python=python)))
        print(f"# {len(plan.runs)} runs; nothing launched (--dry-run); master ports are chosen free at launch")
        return 0
    if args.resume:
        b, counts = batch.resume(plan, parallel=args.parallel, partial=bool(args.only))
        print(f"resuming batch {b.id}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    else:
        b = batch.create(plan, parallel=args.parallel)
        print(f"batch {b.id}: {len(plan.runs)} runs in {b.path}")
    supervisor.spawn(b)
    if args.detach:
        print("runs go on in the background; watch with `dstui status` or `dstui`")
        return 0
    return follow(b, quiet=args.quiet)


def follow(b: BatchDir, *, quiet: bool = False, poll_s: float = 1.0) -> int:
    """Print progress until every run has ended; Ctrl-C leaves the runs going."""
    seen: dict[str, tuple] = {}
    last_print = 0.0
    try:
        while True:
            runs = b.runs()
            now = time.time()
            for rd in runs:
                st = rd.status()
                key = (st.get("state"), st.get("reason"))
                step_due = st.get("state") == "running" and now - last_print > 5
                if not quiet and (seen.get(rd.name) != key or step_due):
                    row = run_row(rd)
                    print("  ".join(x for x in row if x and x != "-"), flush=True)
                    seen[rd.name] = key
            if not quiet and any(rd.state == "running" for rd in runs) and now - last_print > 5:
                last_print = now
            info = b.info()
            if all(rd.state in FINAL_STATES for rd in runs) and info.get("finalized"):
                break
            if not supervisor.is_supervised(b) and not info.get("finalized"):
                time.sleep(1.0)  # it may be starting up
                if not supervisor.is_supervised(b) and not b.info().get("finalized"):
                    print("supervisor is gone; taking over", flush=True)
                    supervisor.spawn(b)
            time.sleep(poll_s)
    except KeyboardInterrupt:
        print(f"\nstopped following; the runs go on. `dstui status {b.id}` to look again, "
              f"`dstui cancel RUN` to stop one.")  # fmt: skip
        return 130
    runs = b.runs()
    print()
    print(table([run_row(rd) for rd in runs], RUN_HEADER))
    failed = [rd for rd in runs if rd.state != "done"]
    print(f"\n{len(runs) - len(failed)}/{len(runs)} runs done; MLflow: {b.info().get('tracking_uri')}")
    return 1 if failed else 0
