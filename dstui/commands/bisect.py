"""`dstui bisect SPEC --condition NAME --good REF --bad REF --metric ...`: find the commit that did it.

The search, its statistics and its files live in :mod:`dstui.bisect`; this
module parses options, takes the per-search lock and prints.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import re
from collections.abc import Iterator
from pathlib import Path

from dstui.analysis.revision_compare import DEFAULT_LOSS_TOL
from dstui.bisect.decide import METRICS
from dstui.core.errors import DstuiError, SpecError

EPILOG = """\
Each tested commit gets a cached env (built once, never the user's own) and a normal batch
of the condition (see `dstui status`, the TUI, MLflow). A commit that does not build or whose
runs crash is skipped, as `git bisect skip` does. Killed, the same command continues: no
commit is built or run twice. Results: <runs>/bisect/<experiment>-<condition>-<key>/.
The spec's own revisions and repeats are not used: the commits are the revisions, --repeats the repeats.
Exit status: 0 with an answer (a first bad commit, or none), 1 when skips leave it ambiguous.

example:
  dstui bisect configs/experiments/smoke.yaml --condition z1 --repo ~/DeepSpeed \\
      --good v0.18.0 --bad master --metric iter_time --threshold 5% --repeats 3
"""


def _fraction(text: str) -> float:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(%?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"'{text}' is not a threshold like 5% or 0.05")
    value = float(m.group(1)) / (100 if m.group(2) else 1)
    if not 0 < value < 10:
        raise argparse.ArgumentTypeError(f"threshold {text} is out of range")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = EPILOG
    p.add_argument("spec", help="experiment spec (YAML) holding the condition")
    p.add_argument("--condition", required=True, help="the condition to run on every tested commit")
    p.add_argument("--good", required=True, help="a ref where the metric is as it should be")
    p.add_argument("--bad", required=True, help="a later ref where it changed")
    p.add_argument("--repo", default=".", help="the DeepSpeed clone (only read; default: the current folder)")
    p.add_argument("--metric", required=True, choices=METRICS, help="what moved: iteration time, loss or peak memory")
    p.add_argument("--threshold", type=_fraction, default=0.05,
                   help="smallest change of iter_time/mem_peak that counts, e.g. 5%% (default 5%%)")  # fmt: skip
    p.add_argument("--loss-tol", type=float, default=DEFAULT_LOSS_TOL,
                   help=f"largest allowed |loss difference| at any step (default {DEFAULT_LOSS_TOL:g}, as `dstui compare`)")  # fmt: skip
    p.add_argument("--repeats", type=int, metavar="N",
                   help="runs per tested commit (default 3 for iter_time, 1 for loss and mem_peak)")  # fmt: skip
    p.add_argument("--max-repeats", type=int, metavar="N",
                   help="iter_time: add runs while undecided, up to N per commit (default 3 x --repeats)")  # fmt: skip
    p.add_argument("--no-validate", action="store_true", help="skip DeepSpeed's config validation")


@contextlib.contextmanager
def _only_one(session: Path) -> Iterator[None]:
    """Two processes bisecting the same range would each run the same commits."""
    with open(session / "bisect.lock", "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            raise DstuiError(f"this bisect is already running (pid {fh.read().strip() or '?'}); "
                             f"its progress: {session / 'progress.json'}") from None  # fmt: skip
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        yield


def run(args: argparse.Namespace) -> int:
    from dstui.bisect.measure import Measurer
    from dstui.bisect.session import Bisect, Options, tag_mlflow
    from dstui.bisect.store import Store
    from dstui.core import paths
    from dstui.execute import batch
    from dstui.revisions.history import first_parent_line

    repeats = args.repeats or (3 if args.metric == "iter_time" else 1)
    if repeats < 1 or (args.max_repeats is not None and args.max_repeats < repeats):
        raise SpecError("--repeats must be >= 1 and --max-repeats >= --repeats", field="--repeats")
    if args.metric == "iter_time" and repeats < 2:
        raise SpecError("iter_time needs --repeats >= 2 (the test compares repeats)", field="--repeats")
    max_repeats = args.max_repeats or (3 * repeats if args.metric == "iter_time" else repeats)
    plan = batch.plan(args.spec, validate=not args.no_validate, resolve_revisions=False, only=[args.condition])
    conds = {r.condition: r for r in plan.runs if r.condition == args.condition}
    if not conds:
        raise SpecError(f"no condition named '{args.condition}'", file=str(plan.spec_path), field="--condition")
    settings = conds[args.condition].settings
    good, line = first_parent_line(args.repo, args.good, args.bad)
    store = Store.for_condition(paths.runs_dir(), plan.spec.name, args.condition, settings)
    session = store.session_dir(good.sha, line[-1].sha, args.metric)
    print(f"bisect {args.metric} of '{args.condition}': {len(line)} first-parent commits after good "
          f"{good.short} up to bad {line[-1].short}; results in {session}", flush=True)  # fmt: skip
    with _only_one(session):
        measurer = Measurer(plan.spec_path, plan.spec, args.condition, settings, Path(args.repo).resolve(), store,
                            say=lambda s: print(s, flush=True))  # fmt: skip
        opts = Options(args.metric, args.threshold, args.loss_tol, repeats, max_repeats)
        out = Bisect(measurer, good, line, opts, session, say=measurer.say,
                     tag=lambda t, sid: tag_mlflow(t, sid, measurer.say)).run()  # fmt: skip
    print()
    print(out.answer())
    print(f"report: {session / 'report.md'}")
    return 0 if out.regression is not None else 1
