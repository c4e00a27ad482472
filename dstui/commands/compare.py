"""`dstui compare`: each revision against a baseline revision, per condition, from MLflow.

The statistics live in :mod:`dstui.analysis.revision_compare` (pure, unit-tested);
this module only fetches runs (through :mod:`dstui.analysis.runs`, so compare and
report read MLflow the same way) and prints.
"""

from __future__ import annotations

import argparse
from typing import Any

from dstui.analysis.parity import default_tolerance
from dstui.analysis.revision_compare import (
    DEFAULT_LOSS_TOL,
    METHOD,
    Comparison,
    RunSample,
    compare,
    samples_from_runs,
)
from dstui.commands import _argtypes
from dstui.core import paths
from dstui.core.errors import DstuiError
from dstui.core.formatting import fmt_bytes, fmt_interval
from dstui.report.found import NothingFound

__all__ = ["RunSample", "format_table", "load_samples", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--experiment", "-e", required=True, help="MLflow experiment (the spec's name)")
    parser.add_argument("--baseline", required=True, help="revision name to compare against, e.g. stable")
    parser.add_argument("--batch", "-b", help="batch id (default: the newest batch that ran the baseline)")
    parser.add_argument(
        "--loss-tol",
        type=_argtypes.tolerance,
        default=None,
        help=f"largest allowed |loss difference| at any step (default: derived like the report's: "
        f"{DEFAULT_LOSS_TOL:g} for fp32, 32 ulp x median |loss| for bf16/fp16, or 3 x the spread between "
        "repeats when larger; the output says which)",
    )
    parser.add_argument("--json", action="store_true", help="print the comparisons as JSON")


def load_samples(experiment: str, batch: str | None, baseline: str) -> tuple[str, list[RunSample]]:
    """Per-run samples of one batch (chosen as the newest with the baseline when not given)."""
    batch_id, samples, _ = load_batch(experiment, batch, baseline)
    return batch_id, samples


def load_batch(experiment: str, batch: str | None, baseline: str) -> tuple[str, list[RunSample], tuple[float, str]]:
    """Batch id, per-run samples and the default loss tolerance with how it was derived."""
    from dstui.analysis import runs as analysis
    from dstui.report import found
    from dstui.tracking import client as tracking

    uri = paths.tracking_uri()
    client = tracking.client(uri)
    _, runs = found.fetch_runs(client, experiment, batch=batch)  # none there: NotFound, exit 3
    if batch is None:
        with_base = [r for r in runs if r.revision == baseline]
        if not with_base:
            raise NothingFound(_no_baseline(baseline, runs))
        batch = max(with_base, key=lambda r: r.start_time or 0).batch
        runs = [r for r in runs if r.batch == batch]
    if not any(r.revision == baseline for r in runs):
        raise NothingFound(_no_baseline(baseline, runs))
    analysis.fetch_histories(client, uri, runs)
    for r in runs:
        r.stats = analysis.compute_run_stats(r)
    analysis.assign_labels(runs)
    trained = [c for c in analysis.condition_stats(runs) if c.kind != "verify"]
    return batch or "", samples_from_runs(runs), default_tolerance(trained)


def _no_baseline(baseline: str, runs: list[Any]) -> str:
    revs = sorted({r.revision for r in runs})
    return f"no runs of baseline revision '{baseline}' (revisions here: {', '.join(revs) or 'none'})"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.2f}"


def format_table(comps: list[Comparison]) -> str:
    from dstui.commands._common import table

    rows = []
    for c in comps:
        mem = fmt_bytes(c.mem_diff, signed=True)
        if c.mem_diff is not None and c.base_mem_peak:
            mem += f" ({c.mem_diff / c.base_mem_peak * 100:+.1f}%)"
        rows.append(
            [
                c.condition,
                c.revision,
                f"{c.n}/{c.n_base}",
                f"{_ms(c.mean)} ± {_ms(c.std)}",
                f"{_ms(c.base_mean)} ± {_ms(c.base_std)}",
                "-" if c.ratio is None else f"{c.ratio:.3f}",
                fmt_interval(*c.ratio_ci) if c.ratio_ci else ("too few repeats" if min(c.n, c.n_base) < 2 else "-"),
                "-" if c.p_value is None else f"{c.p_value:.3g}",
                mem,
                "-" if c.loss_max_diff is None else f"{c.loss_max_diff:.3g} @{c.loss_max_step}",
            ]
        )
    header = [
        "condition", "revision", "n/n_base", "iter ms (mean ± std)", "baseline ms",
        "ratio", "95% CI of ratio", "p (Welch)", "peak mem diff", "max |dloss|",
    ]
    lines = [table(rows, header), ""]
    for c in comps:
        lines.append(f"{c.condition} / {c.revision} vs {c.baseline}: {c.verdict}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    batch, samples, (tol, basis) = load_batch(args.experiment, args.batch, args.baseline)
    if args.loss_tol is not None:
        tol, basis = args.loss_tol, "given"
    comps = compare(samples, args.baseline, loss_tol=tol)
    if comps and not any(c.n_base for c in comps):
        base = [s for s in samples if s.revision == args.baseline]
        raise DstuiError(
            f"no usable baseline: none of the {len(base)} run(s) of revision '{args.baseline}' in batch {batch} "
            "finished with iteration times"
        )
    if args.json:
        # stdout holds only this document (the CLI's machine output)
        from dstui.commands._machine import emit

        emit({"experiment": args.experiment, "batch": batch, "baseline": args.baseline,
              "method": METHOD, "loss_tolerance": tol, "loss_tolerance_basis": basis,
              "comparisons": [c.to_dict() for c in comps]})  # fmt: skip
        return 0
    if not comps:
        revs = sorted({s.revision for s in samples})
        raise DstuiError(f"nothing to compare: batch {batch} has only revision(s) {', '.join(revs)}")
    print(f"experiment {args.experiment}, batch {batch}, baseline '{args.baseline}'")
    print(f"method: {METHOD}")
    print(f"loss tolerance {tol:g} ({basis})")
    print()
    print(format_table(comps))
    return 0
