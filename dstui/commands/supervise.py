"""`dstui supervise BATCH_DIR`: the detached supervisor process (started by `run`)."""

from __future__ import annotations

import argparse

from dstui.execute import supervisor


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("batch_dir")


def run(args: argparse.Namespace) -> int:
    return supervisor.main(args.batch_dir)
