"""`dstui compare`: each revision against a baseline revision, per condition, from MLflow.

The statistics live in :mod:`dstui.analysis.revision_compare` (pure, unit-tested);
the runs are loaded by :mod:`dstui.usecases.results`, the one loader of
`dstui report` and the TUI's Results too, so all three group and read runs
alike. This module only prints.
"""

from __future__ import annotations

import argparse

from dstui.analysis.revision_compare import DEFAULT_LOSS_TOL, Comparison
from dstui.commands import _argtypes
from dstui.core.errors import DstuiError
from dstui.core.formatting import fmt_bytes, fmt_interval

__all__ = ["format_table", "run"]


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
    from dstui.usecases.results import compare_revisions

    res = compare_revisions(args.experiment, args.batch, args.baseline, loss_tol=args.loss_tol)
    comps, tol, basis = res.comparisons, res.tolerance, res.tolerance_basis
    if args.json:
        # stdout holds only this document (the CLI's machine output)
        from dstui.commands._machine import emit

        emit({"experiment": args.experiment, "batch": res.batch, "baseline": args.baseline,
              "method": res.method, "loss_tolerance": tol, "loss_tolerance_basis": basis,
              "comparisons": [c.to_dict() for c in comps]})  # fmt: skip
        return 0
    if not comps:
        revs = sorted({s.revision for s in res.samples})
        raise DstuiError(f"nothing to compare: batch {res.batch} has only revision(s) {', '.join(revs)}")
    print(f"experiment {args.experiment}, batch {res.batch}, baseline '{args.baseline}'")
    print(f"method: {res.method}")
    print(f"loss tolerance {tol:g} ({basis})")
    print()
    print(format_table(comps))
    return 0
