"""`dstui cancel RUN`: stop a run; its whole process group is killed."""

from __future__ import annotations

import argparse

from dstui.commands._common import add_run_refs, find_runs
from dstui.execute import supervisor


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_refs(p)


def run(args: argparse.Namespace) -> int:
    for rd in find_runs(args.runs):
        supervisor.request_cancel(rd)
        print(f"cancel requested: {rd.batch.id}/{rd.name}")
    return 0
