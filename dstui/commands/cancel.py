"""`dstui cancel RUN`: stop a run; its whole process group is killed."""

from __future__ import annotations

import argparse

from dstui import paths, supervisor
from dstui.errors import DstuiError
from dstui.rundir import find_run


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", help="run name, batch/run, or run folder")


def run(args: argparse.Namespace) -> int:
    for ref in args.runs:
        rd = find_run(paths.runs_dir(), ref)
        if rd is None:
            raise DstuiError(f"no run '{ref}' under {paths.runs_dir()}")
        supervisor.request_cancel(rd)
        print(f"cancel requested: {rd.batch.id}/{rd.name}")
    return 0
