"""`dstui list SPEC`: the expanded runs, one line each. Nothing is launched."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from dstui.commands._common import table
from dstui.core.rundir import RunDir
from dstui.execute import batch, launch


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="experiment spec (YAML), e.g. configs/experiments/smoke.yaml")
    p.add_argument(
        "--no-validate",
        action="store_true",
        help="skip DeepSpeed's config validation (faster; the spec itself is still checked)",
    )
    p.add_argument("--only", nargs="+", metavar="PATTERN", help="list only these runs or conditions (shell patterns)")
    p.add_argument("--commands", action="store_true", help="also print each run's exact argv")


def run(args: argparse.Namespace) -> int:
    p = batch.plan(args.spec, validate=not args.no_validate, resolve_revisions=False, only=args.only)
    rows = []
    for r in p.runs:
        s = r.settings
        row = [
            str(r.order), r.name, r.revision, s.kind, s.model, f"z{s.zero_stage}",
            s.offload if s.offload_params == "none" else f"{s.offload}/{s.offload_params}",
            "dc" if s.deepcompile else ("tc" if s.compile else "-"), s.dtype,
            str(s.micro_batch), str(s.seq_length), str(s.grad_accum), str(s.gpus * s.nodes),
            str(s.steps), r.key,
        ]  # fmt: skip
        if s.kind == "command":
            # dstui runs the user's command as it is: the training settings are its own, unknown here
            row[4:12] = ["-"] * 8
        rows.append(row)
    header = ["#", "run", "revision", "kind", "model", "zero", "offload", "compile", "dtype",
              "mb", "seq", "ga", "ranks", "steps", "key"]  # fmt: skip
    print(table(rows, header))
    print(f"\n{len(p.runs)} runs ({p.spec.name}); validated: {not args.no_validate}")
    if args.commands:
        for r in p.runs:
            rd = RunDir(Path("runs/<batch>") / r.name)
            print(shlex.join(launch.build_argv(r, rd)))
    return 0
