"""`dstui retry RUN`: queue a failed or killed run again (the old attempt is kept)."""

from __future__ import annotations

import argparse

from dstui import batch, paths
from dstui.errors import DstuiError
from dstui.rundir import find_run


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", help="run name, batch/run, or run folder")


def run(args: argparse.Namespace) -> int:
    for ref in args.runs:
        rd = find_run(paths.runs_dir(), ref)
        if rd is None:
            raise DstuiError(f"no run '{ref}' under {paths.runs_dir()}")
        batch.retry(rd)
        print(f"queued again: {rd.batch.id}/{rd.name} (previous attempt kept in {rd.path}/attempts/)")
    return 0
