"""`dstui import`: bring existing result folders and seed-format logs into MLflow.

The work is :func:`dstui.importer.seedlogs.import_dir`; imported runs become a batch
like any launched one, so `dstui report --batch import-FOLDER` works on them.
"""

from __future__ import annotations

import argparse

from dstui.commands import _argtypes

DESCRIPTION = """\
Import a folder of old results (or one log file) into MLflow.

Understood: the seed's per-step lines
  Epoch 1, Step 10, Loss: 2.345678 sync: True time: 0.123 alloc_mem: 1234 peak_mem: 5678
the closing summary line of DeepSpeedExamples' DeepCompile benchmark run_acc_lm.py
  <model> ds=True np=8 batch_size=1 seq=512 zero_stage=1 ... deepcompile=False ... iteration time: 0.4782 alloc_mem: ... peak_mem: ...
the same as key=value lines (step=10 loss=2.3 time=0.12 / model=X zero_stage=3 ... iter_time_mean=0.5),
argparse Namespace(...) dumps, metadata.json of run_batch_enhanced.sh, and dstui's metrics.jsonl.

Each log becomes an MLflow child run (condition from metadata.json or the
file name, settings as params, every step as metrics) under a parent run
tagged dstui.batch=import-<folder name>. A log that holds several runs is split
at each summary line. Lines that look like records but do not parse are
counted and reported, never fatal; a step line is imported or counted, not
both (a nan/inf loss beside a time is imported without the loss, and a run
with no usable loss at all is failed). A job restarted into the same log
(steps going backwards) stays one run: the first attempt to log a step wins,
repeats are counted. X.log and X_detailed.log with the same steps are
imported once. Unreadable files and folders are skipped with why.
Folders logs_<rev>_runN give revision and repeat (runN numbered from 1,
or from 0 when a run0 is there), shown per run.

Ctrl-C marks the partial batch killed; importing the same path again
replaces it (no --force needed).

examples:
  dstui import results_20250617_035117/
  dstui import old_logs/ --experiment deepcompile-2025 --warmup 2
  dstui report --experiment imported --batch import-results_20250617_035117 -o report/
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `dstui import`."""
    parser.description = DESCRIPTION
    parser.add_argument("path", metavar="DIR", help="result folder (searched recursively) or one log file")
    parser.add_argument(
        "--experiment", "-e", default="imported", metavar="NAME",
        help="MLflow experiment to import into (created if missing; default: imported)",
    )
    parser.add_argument(
        "--warmup", type=_argtypes.count(0), default=1, metavar="N",
        help="leading logged steps of each run that reports exclude from statistics "
        "(old logs do not say; the first step usually includes compilation; default: 1)",
    )
    parser.add_argument(
        "--force", action="store_true",
        help="replace an earlier import of the same path (default: refuse to import it twice)",
    )


def run(args: argparse.Namespace) -> int:
    """Import and print what happened; 1 when nothing could be imported, 130 when interrupted.

    SIGTERM is taken as Ctrl-C while importing, so a killed import still marks its partial
    runs (an import killed outright leaves them RUNNING, for ``--force`` to replace)."""
    import signal
    import sys

    from dstui.core import exit_codes, names
    from dstui.importer.seedlogs import ImportInterrupted, import_dir

    names.check(args.experiment, field="--experiment")  # an MLflow name: the rule of every name

    def say(line: str) -> None:  # progress of a large log, beside (not in) the result on stdout
        print(line, file=sys.stderr, flush=True)

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    installed = False
    try:
        before = signal.signal(signal.SIGTERM, interrupt)
        installed = True
    except ValueError:  # not the main thread (the TUI): SIGTERM stays as it is
        before = None
    try:
        result = import_dir(args.path, args.experiment, warmup=args.warmup, force=args.force, progress=say)
    except ImportInterrupted as e:
        print(f"\ndstui: {e}", file=sys.stderr)
        return exit_codes.INTERRUPTED
    finally:
        if installed:
            signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)
    print(result.summary_text())
    return 0 if result.runs else 1
