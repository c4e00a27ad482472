"""`dstui report`: export a markdown report with charts, CSV and JSON from MLflow.

The work is :func:`dstui.usecases.report.export`, shared with the TUI's results
view; this module only turns arguments into that call and prints where the
report went.
"""

from __future__ import annotations

import argparse
import sys

from dstui.commands import _argtypes

DESCRIPTION = """\
Build a report from the runs MLflow holds (launched, imported, or on a team
server): report.md with PNG charts beside it, runs.csv, conditions.csv and
data.json (params, tags, statistics and every per-step history), plus
grid_iter_time.csv / grid_mem.csv when the runs vary model and micro batch.
The folder is also logged as artifact 'report' to the MLflow parent run of
every batch it covers (one batch with -b, else each batch of the
experiment); the last line on stderr says which.

Runs are repeats of one condition only when they ran with the same settings
(spec settings, DeepSpeed config and version, world size, steps): batches
that ran a condition with other settings are reported as conditions of their
own, named by what differs. Runs that never started (cancelled before start,
skipped) are listed, never counted. Statistics exclude each run's warm-up
steps (param warmup_steps). Failed and out-of-memory runs are listed with
their reason, never dropped. Runs timed while another run shared the machine
(tag dstui.overlapped) are flagged under Data quality and left out of speed
comparisons (their loss and memory still count); --include-overlapped keeps them.

examples:
  dstui report --experiment zero_stages -o reports/zero
  dstui report --experiment zero_stages --batch zero_stages-20261121-101500 -o r/
  dstui report --experiment zero_stages --baseline z1 --tolerance 1e-4 -o r/
  dstui report --experiment imported --batch import-results_20250617_035117 -o r/
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `dstui report` (help texts say what each changes in the report)."""
    parser.description = DESCRIPTION
    parser.add_argument(
        "--experiment", "-e", required=True, metavar="NAME",
        help="MLflow experiment (the spec's name, or 'imported' for `dstui import`)",
    )
    parser.add_argument(
        "--batch", "-b", metavar="ID",
        help="only this batch (tag dstui.batch, e.g. NAME-YYYYmmdd-HHMMSS or import-FOLDER); "
        "default: every dstui run of the experiment",
    )
    parser.add_argument(
        "--runs", nargs="+", metavar="RUN_ID",
        help="only these MLflow run ids (they need not be dstui runs)",
    )
    parser.add_argument(
        "--baseline", metavar="CONDITION",
        help="condition that speed, memory and loss parity are compared against "
        "(label or condition name; default: the first condition)",
    )
    parser.add_argument(
        "--tolerance", type=_argtypes.tolerance, default=None, metavar="TOL",
        help="loss parity: PASS when max |mean loss - baseline mean loss| over common steps "
        "is at most TOL (default: derived from the runs: 1e-3 for fp32, 32 ulp x median |loss| for "
        "bf16/fp16, or 3 x the spread between repeats when larger; the report says which)",
    )
    parser.add_argument(
        "-o", "--output", required=True, metavar="DIR",
        help="folder to write report.md, charts, CSV and data.json into (created if missing)",
    )
    parser.add_argument(
        "--include-overlapped", action="store_true",
        help="count the timings of runs that other runs shared the machine with (tag dstui.overlapped) in "
        "speed figures and comparisons; by default they are flagged under Data quality and left out",
    )
    parser.add_argument(
        "--no-mlflow-artifact", action="store_true",
        help="do not log the folder to the MLflow parent runs of its batches",
    )
    parser.add_argument("--quiet", "-q", action="store_true", help="print only the report path")
    parser.add_argument("--json", action="store_true", help="print where the report went as one JSON document")


def run(args: argparse.Namespace) -> int:
    """Export the report; errors (unknown experiment, no runs) are DstuiErrors the CLI prints."""
    from dstui.usecases.report import export

    def progress(frac: float, msg: str) -> None:
        if not args.quiet:
            print(f"[{frac * 100:3.0f}%] {msg}", file=sys.stderr)

    done = export(
        args.experiment,
        args.output,
        batch=args.batch,
        runs=args.runs,
        baseline=args.baseline,
        tolerance=args.tolerance,
        progress=progress,
        log_artifact=not args.no_mlflow_artifact,
        include_overlapped=args.include_overlapped,
    )
    if args.json:
        from dstui.commands._machine import emit

        emit({"experiment": args.experiment, "batch": args.batch, "report": str(done.report),
              "folder": str(args.output), "logged_to": done.logged_to, "not_logged": done.not_logged})  # fmt: skip
        return 0
    print(done.report)
    return 0
