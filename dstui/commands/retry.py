"""`dstui retry RUN`: queue a failed or killed run again (the old attempt is kept)."""

from __future__ import annotations

import argparse

from dstui.commands._common import add_run_refs, find_runs
from dstui.execute import batch


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_refs(p)


def run(args: argparse.Namespace) -> int:
    for rd in find_runs(args.runs):
        batch.retry(rd)
        print(f"queued again: {rd.batch.id}/{rd.name} (previous attempt kept in {rd.path}/attempts/)")
    return 0
