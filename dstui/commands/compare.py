"""`dstui compare`: each revision against a baseline revision, per condition, from MLflow.

The statistics live in :mod:`dstui.analysis.revision_compare` (pure, unit-tested);
this module only fetches runs (through :mod:`dstui.analysis.runs`, so compare and
report read MLflow the same way) and prints.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from dstui.analysis.revision_compare import DEFAULT_LOSS_TOL, METHOD, Comparison, RunSample, compare
from dstui.core import paths
from dstui.core.errors import DstuiError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--experiment", required=True, help="MLflow experiment (the spec's name)")
    parser.add_argument("--baseline", required=True, help="revision name to compare against, e.g. stable")
    parser.add_argument("--batch", help="batch id (default: the newest batch that ran the baseline)")
    parser.add_argument(
        "--loss-tol",
        type=float,
        default=DEFAULT_LOSS_TOL,
        help=f"largest allowed |loss difference| at any step (default {DEFAULT_LOSS_TOL:g})",
    )
    parser.add_argument("--json", action="store_true", help="print the comparisons as JSON")


def load_samples(experiment: str, batch: str | None, baseline: str) -> tuple[str, list[RunSample]]:
    """Per-run samples of one batch (chosen as the newest with the baseline when not given)."""
    from mlflow.tracking import MlflowClient

    from dstui.analysis import runs as analysis

    uri = paths.tracking_uri()
    client = MlflowClient(tracking_uri=uri)
    _, runs = analysis.fetch_runs(client, experiment, batch=batch)
    if batch is None:
        with_base = [r for r in runs if r.revision == baseline]
        if not with_base:
            raise DstuiError(_no_baseline(baseline, runs))
        batch = max(with_base, key=lambda r: r.start_time or 0).batch
        runs = [r for r in runs if r.batch == batch]
    if not any(r.revision == baseline for r in runs):
        raise DstuiError(_no_baseline(baseline, runs))
    analysis.fetch_histories(client, uri, runs)
    samples = []
    for r in runs:
        st = analysis.compute_run_stats(r)
        steps, values = r.history.get("loss", ((), ()))
        samples.append(
            RunSample(
                condition=r.condition,
                revision=r.revision,
                iter_time_mean=st.get("iter_time_mean"),
                mem_peak=st.get("mem_peak_max"),
                loss={int(s): float(v) for s, v in zip(steps, values, strict=False)},
                usable=r.status == "done",
            )
        )
    return batch or "", samples


def _no_baseline(baseline: str, runs: list[Any]) -> str:
    revs = sorted({r.revision for r in runs})
    return f"no runs of baseline revision '{baseline}' (revisions here: {', '.join(revs) or 'none'})"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.2f}"


def _mem(x: float | None) -> str:
    if x is None:
        return "-"
    sign = "+" if x >= 0 else "-"
    x = abs(x)
    for unit in ("B", "KB", "MB", "GB"):
        if x < 1024 or unit == "GB":
            return f"{sign}{x:.0f}{unit}" if unit == "B" else f"{sign}{x:.1f}{unit}"
        x /= 1024
    return "-"


def format_table(comps: list[Comparison]) -> str:
    from dstui.commands._common import table

    rows = []
    for c in comps:
        mem = _mem(c.mem_diff)
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
                "-" if not c.ratio_ci else f"{c.ratio_ci[0]:.3f}-{c.ratio_ci[1]:.3f}",
                "-" if c.p_value is None else f"{c.p_value:.3g}",
                mem,
                "-" if c.loss_max_diff is None else f"{c.loss_max_diff:.3g} @{c.loss_max_step}",
            ]
        )
    header = [
        "condition", "revision", "n/n_base", "iter ms (mean ± std)", "baseline ms",
        "ratio", "95% CI", "p (Welch)", "peak mem diff", "max |dloss|",
    ]
    lines = [table(rows, header), ""]
    for c in comps:
        lines.append(f"{c.condition} / {c.revision} vs {c.baseline}: {c.verdict}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    batch, samples = load_samples(args.experiment, args.batch, args.baseline)
    comps = compare(samples, args.baseline, loss_tol=args.loss_tol)
    if args.json:
        print(json.dumps({"experiment": args.experiment, "batch": batch, "baseline": args.baseline,
                          "method": METHOD, "comparisons": [c.to_dict() for c in comps]}, indent=2))
        return 0
    if not comps:
        revs = sorted({s.revision for s in samples})
        raise DstuiError(f"nothing to compare: batch {batch} has only revision(s) {', '.join(revs)}")
    print(f"experiment {args.experiment}, batch {batch}, baseline '{args.baseline}'")
    print(f"method: {METHOD}; loss tolerance {args.loss_tol:g}")
    print()
    print(format_table(comps))
    return 0
