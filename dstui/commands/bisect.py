"""`dstui bisect SPEC --condition NAME --good REF --bad REF --metric ...`: find the commit (or release) that did it.

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
from typing import TYPE_CHECKING, Any

from dstui.analysis.revision_compare import DEFAULT_LOSS_TOL
from dstui.bisect.decide import METRICS, VERDICT, check_recorded_name, is_recorded
from dstui.commands import _argtypes
from dstui.core.errors import DstuiError, SpecError

if TYPE_CHECKING:
    from dstui.revisions.history import Commit
    from dstui.spec.settings import Settings

EPILOG = """\
How a tested commit (or release) is judged, by --metric:
  iter_time   bad when significantly slower (Welch t-test, p < 0.05) by at least --threshold (default 5%);
              good when the 95% interval of the ratio to the good end stays below 1 + threshold;
              otherwise more runs (up to --max-repeats), then skip.
  loss        bad when the largest per-step gap of the mean loss curves exceeds --loss-tol.
  mem_peak    bad when the peak memory grew by more than --threshold.
  verdict     the runs' own check: a `kind: verify` condition (ZeRO against plain PyTorch: losses,
              gradients, parameters) or one with `sp_check: true` (Ulysses). Bad when a run FAILs, good
              when every run PASSes. No baseline run: the good end is run only when the answer is the
              first candidate after it. Catches wrong gradients that move the loss by 1e-7.
  <field>     any value the runs record per step or in their summary (e.g. grad_max_abs_diff,
              grad_norm, tokens_per_s) or a ratio of two (grad_norm/grad_norm_baseline): bad when, at
              some step, the mean over runs differs from the good end's by more than --threshold
              (required; absolute in the field's unit, e.g. 0.01, or relative with %, e.g. 5%).

Releases: with --good and --bad as version numbers (0.16.0, not v0.16.0) the search walks the
DeepSpeed releases between them as the configured package index lists them (`pip index versions`),
each in its cached PyPI env, and names the first bad release; with --repo it then walks the
first-parent commits between the last good and the first bad release's tags (v<version>).

Each tested revision gets a cached env (built once, never the user's own) and a normal batch
of the condition (see `dstui status`, the TUI, MLflow). A revision that does not build or whose
runs crash is skipped, as `git bisect skip` does. Progress (the revision being built or run,
outcomes left, about how many more tests) is printed and shown in the TUI's runs screen.
Killed (Ctrl-C), the same command continues: no revision is built or run twice.
Results: <runs>/bisect/<experiment>-<condition>-<key>/ (report.md per search, with the search path).
The spec's own revisions and repeats are not used: the revisions are tested, --repeats the repeats.
Exit status: 0 with an answer (a first bad revision, or none), 1 when skips leave it ambiguous.

examples:
  dstui bisect configs/experiments/smoke.yaml --condition z1 --repo ~/DeepSpeed \\
      --good v0.18.0 --bad master --metric iter_time --threshold 5% --repeats 3
  dstui bisect verify.yaml --condition z2 --good 0.16.0 --bad 0.18.0 --metric verdict --repo ~/DeepSpeed
  dstui bisect verify.yaml --condition z2 --repo ~/DeepSpeed --good v0.18.0 --bad master \\
      --metric grad_norm/grad_norm_baseline --threshold 0.01
"""


def _threshold(text: str) -> tuple[float, bool]:
    """'5%' -> (0.05, relative); '0.05' -> (0.05, as given: relative for iter_time/mem_peak, absolute for a field)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(%?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"'{text}' is not a threshold like 5% or 0.05")
    value = float(m.group(1)) / (100 if m.group(2) else 1)
    if not 0 < value < 1e12:
        raise argparse.ArgumentTypeError(f"threshold {text} is out of range")
    return value, bool(m.group(2))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = EPILOG
    p.add_argument("spec", help="experiment spec (YAML) holding the condition")
    p.add_argument("--condition", required=True, help="the condition to run on every tested revision")
    p.add_argument("--good", required=True, help="a ref (or a release: 0.16.0) where the metric is as it should be")
    p.add_argument("--bad", required=True, help="a later ref (or release) where it changed")
    p.add_argument("--repo", help="the DeepSpeed clone (only read; default: the current folder; "
                                  "with releases: walk the commits between their tags)")  # fmt: skip
    p.add_argument("--metric", required=True, metavar="METRIC",
                   help=f"{', '.join(METRICS)}, or a recorded field (see below)")  # fmt: skip
    p.add_argument("--threshold", type=_threshold,
                   help="smallest change that counts: iter_time/mem_peak relative (5%% or 0.05; default 5%%); "
                        "a recorded field: absolute (0.01) or relative (5%%)")  # fmt: skip
    p.add_argument("--loss-tol", type=_argtypes.tolerance, default=DEFAULT_LOSS_TOL,
                   help=f"--metric loss: largest allowed |loss difference| at any step (default {DEFAULT_LOSS_TOL:g}, "
                        "fixed; `dstui compare` derives its default from the dtype and the spread between repeats)")  # fmt: skip
    p.add_argument("--repeats", type=_argtypes.count(1), metavar="N",
                   help="runs per tested revision (default 3 for iter_time, 1 otherwise)")  # fmt: skip
    p.add_argument("--max-repeats", type=_argtypes.count(1), metavar="N",
                   help="iter_time: add runs while undecided, up to N per revision (default 3 x --repeats)")  # fmt: skip
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


def _check_metric(args: argparse.Namespace, settings: Settings) -> tuple[float, bool]:
    """Bad combinations of metric, threshold and condition, as one-line errors; the threshold to use."""
    metric = args.metric
    if is_recorded(metric):
        why = check_recorded_name(metric)
        if why:
            raise SpecError(why, field="--metric")
        if args.threshold is None:
            raise SpecError(f"--metric {metric} needs --threshold: the largest allowed difference from the good "
                            "end, absolute (e.g. 0.01) or relative (e.g. 5%)", field="--threshold")  # fmt: skip
        return args.threshold
    if metric == VERDICT:
        if args.threshold is not None:
            raise SpecError("--metric verdict takes no --threshold: a run's check says PASS or FAIL "
                            "(to bisect on a value, give it: --metric grad_max_abs_diff --threshold 1e-6)",
                            field="--threshold")  # fmt: skip
        if settings.kind != "verify" and not settings.sp_check:
            raise SpecError(f"--metric verdict needs a condition whose runs give a verdict (kind: verify, or "
                            f"sp_check: true); condition '{args.condition}' is kind: {settings.kind} without "
                            "sp_check", field="--metric")  # fmt: skip
        return 0.0, False
    value, percent = args.threshold or (0.05, True)
    if not percent and value >= 1:  # relative only: '5' would be 500%, surely meant as 5%
        raise SpecError(f"--threshold {value:g} for {metric} is relative: {value:g} means {value:.0%}; "
                        f"write {value:g}% (or {value / 100:g})", field="--threshold")  # fmt: skip
    return value, True  # iter_time / mem_peak: always relative, as before


@contextlib.contextmanager
def _as_condition_error() -> Iterator[None]:
    try:
        yield
    except SpecError as e:
        if e.field == "--only":
            e.field, e.message = "--condition", e.message.replace("no run matches", "no condition matches")
            e.args = (str(e),)
        raise


def _tags(repo: Path, versions: list[str]) -> dict[str, str]:
    from dstui.bisect.releases import release_tag

    return {v: release_tag(repo, v) for v in versions}


def run(args: argparse.Namespace) -> int:
    from dstui.bisect.measure import Measurer
    from dstui.bisect.releases import available_releases, is_release, release_line
    from dstui.bisect.session import Bisect, Options, Outcome, tag_mlflow
    from dstui.bisect.store import Store
    from dstui.core import paths
    from dstui.revisions.history import first_parent_line
    from dstui.usecases import launch
    from dstui.usecases.options import LaunchOptions

    repeats = args.repeats or (3 if args.metric == "iter_time" else 1)
    if args.max_repeats is not None and args.max_repeats < repeats:  # each is >= 1 (_argtypes.count)
        raise SpecError("--repeats must be >= 1 and --max-repeats >= --repeats", field="--repeats")
    if args.metric == "iter_time" and repeats < 2:
        raise SpecError("iter_time needs --repeats >= 2 (the test compares repeats)", field="--repeats")
    max_repeats = args.max_repeats or (3 * repeats if args.metric == "iter_time" else repeats)
    with _as_condition_error():  # the plan says '--only', an option the user of bisect never gave
        options = LaunchOptions(validate=not args.no_validate, only=[args.condition])
        plan = launch.make_plan(args.spec, options, resolve_revisions=False)
    conds = {r.condition: r for r in plan.runs if r.condition == args.condition}
    if not conds:
        raise SpecError(f"no condition named '{args.condition}'", file=str(plan.spec_path), field="--condition")
    settings = conds[args.condition].settings
    threshold, relative = _check_metric(args, settings)
    releases = is_release(args.good) and is_release(args.bad)
    repo = Path(args.repo).expanduser().resolve() if args.repo or not releases else None
    if releases:
        good, line = release_line(args.good, args.bad, available_releases())
        tags = _tags(repo, [good.short] + [r.short for r in line]) if repo else {}
    else:
        good, line = first_parent_line(repo or ".", args.good, args.bad)
    store = Store.for_condition(paths.runs_dir(), plan.spec.name, args.condition, settings)
    measurer = Measurer(plan.spec_path, plan.spec, args.condition, settings, repo, store,
                        say=lambda s: print(s, flush=True))  # fmt: skip
    opts = Options(args.metric, threshold, args.loss_tol, repeats, max_repeats, relative)

    def search(good: Commit, line: list[Commit], noun: str, **kw: Any) -> tuple[Outcome, Path]:
        session = store.session_dir(good.sha, line[-1].sha, args.metric)
        print(f"bisect {args.metric} of '{args.condition}': {len(line)} {noun}s after good {good.short} up to bad "
              f"{line[-1].short}; results in {session}", flush=True)  # fmt: skip
        with _only_one(session):
            out = Bisect(measurer, good, line, opts, session, say=measurer.say, noun=noun,
                         tag=lambda t, sid: tag_mlflow(t, sid, measurer.say), **kw).run()  # fmt: skip
        print()
        print(out.answer())
        print(f"report: {session / 'report.md'}", flush=True)
        return out, session

    out, session = search(good, line, "release" if releases else "commit")
    if releases and repo is not None and out.first_bad is not None:
        i = out.conclusion.first_bad or 0
        last_good = line[i - 1] if i else good
        bad = out.first_bad
        print(f"\nfirst bad release {bad.short}: walking the commits of {repo} between {tags[last_good.short]} "
              f"and {tags[bad.short]}", flush=True)  # fmt: skip
        c_good, c_line = first_parent_line(repo, tags[last_good.short], tags[bad.short])
        context = (f"narrowed by the release walk: last good release {last_good.short}, first bad {bad.short} "
                   f"(report: {session / 'report.md'})")  # fmt: skip
        # the last good release was shown good (tested, or the good end checked by the walk)
        out, _ = search(c_good, c_line, "commit", good_known=True, context=context)
    return 0 if out.regression is not None else 1
