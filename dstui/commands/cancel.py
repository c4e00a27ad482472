"""`dstui cancel REF...`: stop runs, or every run of a batch; each run's whole process group is killed.

REF is a batch id (every run of it), a run name, BATCH/RUN, or shell patterns over
them (see :mod:`dstui.commands._select`). Runs that already ended are left as they are.
"""

from __future__ import annotations

import argparse

from dstui.commands import _machine
from dstui.commands._common import add_run_refs, find_runs
from dstui.commands._records import run_record
from dstui.usecases import control


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_refs(p, what="cancel")
    p.add_argument("--json", action="store_true", help="print what was cancelled as one JSON document")


def run(args: argparse.Namespace) -> int:
    cancelled, ended = control.cancel(find_runs(args.runs))
    for rd in cancelled:
        print(f"cancel requested: {rd.batch.id}/{rd.name}")
    if ended:
        print(f"already ended, left as they are: {', '.join(f'{rd.batch.id}/{rd.name}' for rd in ended)}")
    if _machine.active():
        _machine.emit({"cancelled": [run_record(rd) for rd in cancelled], "already_ended": [run_record(rd) for rd in ended]})
    return 0
