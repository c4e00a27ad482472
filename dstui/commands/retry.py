"""`dstui retry REF...`: queue failed, killed or skipped runs again (the old attempts are kept).

`dstui retry BATCH --failed` queues every failed or killed run of a batch; REF
takes the same forms and patterns as `dstui cancel` (see :mod:`dstui.commands._select`).
A done run is queued again only with ``--force``; reports then count its new
attempt in its place (never both as two repeats).
"""

from __future__ import annotations

import argparse

from dstui.commands import _machine
from dstui.commands._common import add_run_refs, find_runs
from dstui.commands._records import run_record
from dstui.commands._select import names_whole_batch
from dstui.core.errors import DstuiError, NotFound
from dstui.core.rundir import FINAL_STATES, RETRIABLE_STATES
from dstui.usecases import control


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_refs(p, what="retry")
    p.add_argument(
        "--failed", action="store_true",
        help="only the failed and killed runs of what REF names (needed when REF names whole batches)",
    )  # fmt: skip
    p.add_argument(
        "--force", action="store_true",
        help="also queue done runs again (a new measurement: reports count the new attempt instead of the old)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print what was queued again as one JSON document")


def run(args: argparse.Namespace) -> int:
    whole = [ref for ref in args.runs if names_whole_batch(ref)]
    if whole and not args.failed:
        raise DstuiError(f"'{whole[0]}' names whole batches: add --failed to queue their failed and killed runs again")
    runs = find_runs(args.runs)
    if args.failed:
        runs = [rd for rd in runs if rd.state in ("failed", "killed")]
        if not runs:
            raise NotFound(f"no failed or killed runs in {' '.join(args.runs)}")
    busy = [rd for rd in runs if rd.state not in FINAL_STATES]
    if busy:  # before any run is touched: all or nothing
        raise DstuiError(f"run {busy[0].batch.id}/{busy[0].name} is {busy[0].state}; only finished runs can be retried")
    done = [rd for rd in runs if rd.state not in RETRIABLE_STATES]
    if done and not args.force:  # all or nothing, as above
        names = ", ".join(f"{rd.batch.id}/{rd.name}" for rd in done[:3]) + (f" and {len(done) - 3} more" if len(done) > 3 else "")
        raise DstuiError(
            f"{names}: {'is' if len(done) == 1 else 'are'} {done[0].state}; retry queues failed, killed or skipped runs "
            "(--force runs done ones again: reports then count the new attempt, not both)"
        )
    queued = control.requeue(runs, force=args.force)
    for rd in queued:
        print(f"queued again: {rd.batch.id}/{rd.name} (previous attempt kept in {rd.path}/attempts/)")
    if _machine.active():
        _machine.emit({"queued": [run_record(rd) for rd in queued]})
    return 0
