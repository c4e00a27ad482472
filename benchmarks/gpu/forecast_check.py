"""Memory forecast vs measured peak, per run folder of finished GPU batches (issue 14's goal: within 15%).

Reads each run's ``metrics.jsonl`` (the header's runner config and ds_config,
the summary's ``mem_peak_max`` = ``torch.cuda.max_memory_allocated``) and
forecasts it with :func:`dstui.analysis.forecast.forecast`: analytic, and
(``--loo``) fitted on the *other* runs of the same batches (leave one out), so a
run never predicts itself. A run that failed with CUDA OOM counts as right when
the forecast is above the GPU's memory.

    .ci/with-env python benchmarks/gpu/forecast_check.py docs/gpu-validation/runs/gpu-validation-*/ --loo
    # on a GPU machine after `dstui run configs/experiments/gpu_validation.yaml` and the grid:
    python benchmarks/gpu/forecast_check.py runs/gpu-validation-*/ runs/forecast-grid-*/ --loo --json out.json

Exit status 1 when a run misses by more than ``--tolerance`` (default 15%).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from dstui.analysis.forecast import ActivationFit, forecast, observe, settings_of
from dstui.analysis.forecast_model import GIB
from dstui.core.rundir import RunDir, read_json
from dstui.execute import sysmetrics


def load_run(path: Path) -> dict[str, Any] | None:
    """Settings, ds_config, measured peak (bytes) and state of one run folder; None if not a GPU run."""
    rd = RunDir(path)
    header, peak = None, 0.0
    if not rd.metrics_file.exists():
        return None
    for line in rd.metrics_file.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("type") == "header":
            header = rec
        elif rec.get("type") == "step":
            peak = max(peak, float(rec.get("mem_peak") or 0))
        elif rec.get("type") == "summary" and rec.get("mem_peak_max"):
            peak = max(peak, float(rec["mem_peak_max"]))
    if header is None or header.get("device") != "cuda":
        return None
    settings = settings_of({**header.get("config", {}), "gpus": header.get("world_size", 1)})
    if settings is None:
        return None
    status = rd.status()
    return {
        "name": f"{path.parent.name}/{path.name}",
        "settings": settings,
        "ds_config": header.get("ds_config") or read_json(rd.ds_config_file, {}),
        "peak": peak,
        "oom": "out of memory" in (status.get("reason") or "").lower(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("batches", nargs="+", type=Path, help="batch folders (runs/<batch_id>/)")
    p.add_argument("--loo", action="store_true", help="also forecast from a fit on the other runs")
    p.add_argument("--tolerance", type=float, default=0.15, help="allowed relative error (default 0.15)")
    p.add_argument("--gpu-mem-gib", type=float, default=None,
                   help="GPU memory an OOM run is judged against (default: GPU 0 of this machine)")
    p.add_argument("--json", type=Path, help="write the rows here as well")
    args = p.parse_args(argv)

    found = [r for b in args.batches for d in sorted(b.iterdir()) if d.is_dir() and (r := load_run(d))]
    runs = [r for r in found if r["peak"] or r["oom"]]  # a run cancelled before its first step measured nothing
    if not runs:
        print("no GPU runs with a metrics.jsonl header under the given folders", file=sys.stderr)
        return 2
    rows, worst = [], 0.0
    capacity = args.gpu_mem_gib * GIB if args.gpu_mem_gib else sysmetrics.gpu_memory_total()
    for run in runs:
        fc = forecast(run["settings"], ds_config=run["ds_config"])
        row = {"run": run["name"], "measured_gib": run["peak"] / GIB, "analytic_gib": fc.gib if fc else None}
        if args.loo:
            fit = ActivationFit()
            for other in runs:
                if other is not run and other["peak"] and not other["oom"]:
                    observe(fit, other["settings"], other["peak"], other["ds_config"])
            lfc = forecast(run["settings"], ds_config=run["ds_config"], fit=fit)
            row["fit_gib"] = lfc.gib if lfc and lfc.source != "analytic" else None
        best = row.get("fit_gib") or row["analytic_gib"]
        if run["oom"]:
            row["error_pct"] = None
            row["ok"] = bool(capacity and best and best * GIB > capacity)  # forecast to run out as well
        elif best and run["peak"]:
            err = (best * GIB - run["peak"]) / run["peak"]
            row["error_pct"] = 100 * err
            row["ok"] = abs(err) <= args.tolerance
            worst = max(worst, abs(err))
        rows.append(row)
    cols = ["run", "measured_gib", "analytic_gib", "fit_gib", "error_pct", "ok"]
    print("  ".join(f"{c:>14}" for c in cols))
    for row in rows:
        print("  ".join(f"{row.get(c):>14.2f}" if isinstance(row.get(c), float) else f"{row.get(c)!s:>14}" for c in cols))
    print(f"\nworst |error| {100 * worst:.1f}% (tolerance {100 * args.tolerance:.0f}%), memory in GiB")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
