#!/usr/bin/env python
"""Compare dstui's GPU readings (system.jsonl, via NVML) with nvidia-smi sampled at the same time.

For each system.jsonl record and each GPU in it, the nvidia-smi row of that GPU whose
mid-time is nearest (within --window s) is taken; the table gives, per quantity, the
number of pairs, the mean difference dstui - nvidia-smi, the mean absolute difference
and the largest one. Memory is compared in MiB (dstui logs bytes).

    python benchmarks/gpu/nvsmi_check.py --nvsmi nvsmi.csv runs/BATCH/*/system.jsonl
"""

from __future__ import annotations

import argparse
import bisect
import csv
import json
import re
import statistics
import sys
from pathlib import Path

MIB = 1024 * 1024
PAIRS = [  # (dstui key pattern, nvidia-smi column, scale of dstui's value to smi's unit)
    ("util_percent", "utilization.gpu", 1.0),
    ("mem_used_bytes", "memory.used", 1.0 / MIB),
    ("power_w", "power.draw", 1.0),
]


def load_smi(path: Path) -> dict[int, list[tuple[float, dict]]]:
    by_gpu: dict[int, list[tuple[float, dict]]] = {}
    with open(path) as fh:
        for row in csv.DictReader(fh):
            try:
                t = (float(row["t_before"]) + float(row["t_after"])) / 2
                by_gpu.setdefault(int(row["index"]), []).append((t, row))
            except (KeyError, ValueError):
                continue
    for rows in by_gpu.values():
        rows.sort(key=lambda x: x[0])
    return by_gpu


def nearest(rows: list[tuple[float, dict]], t: float) -> tuple[float, dict] | None:
    times = [r[0] for r in rows]
    i = bisect.bisect_left(times, t)
    cands = [rows[j] for j in (i - 1, i) if 0 <= j < len(rows)]
    return min(cands, key=lambda r: abs(r[0] - t)) if cands else None


def num(x: str) -> float | None:
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nvsmi", required=True)
    p.add_argument("--window", type=float, default=0.6)
    p.add_argument(
        "--busy-only", action="store_true", help="only pairs where nvidia-smi shows > 0%% util"
    )
    p.add_argument("--out", default=None, help="write the result as JSON here")
    p.add_argument("system", nargs="+", help="system.jsonl files")
    a = p.parse_args(argv)
    smi = load_smi(Path(a.nvsmi))
    diffs: dict[str, list[tuple[float, float]]] = {}
    for f in a.system:
        for line in Path(f).read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            t = rec.get("time")
            for key, value in rec.items():
                m = re.fullmatch(r"gpu(\d+)_(.+)", key)
                if not m or t is None:
                    continue
                gpu, what = int(m[1]), m[2]
                pair = next((pp for pp in PAIRS if pp[0] == what), None)
                if pair is None or gpu not in smi:
                    continue
                near = nearest(smi[gpu], t)
                if near is None or abs(near[0] - t) > a.window:
                    continue
                ref = num(near[1].get(pair[1]))
                if ref is None:
                    continue
                if a.busy_only and (num(near[1].get("utilization.gpu")) or 0) == 0:
                    continue
                diffs.setdefault(what, []).append((float(value) * pair[2], ref))
    out = {}
    print(
        f"{'quantity':<16}{'pairs':>7}{'dstui mean':>13}{'smi mean':>11}{'mean diff':>11}{'mean |diff|':>13}{'max |diff|':>12}"
    )
    for what, pairs in diffs.items():
        d = [x - y for x, y in pairs]
        row = {
            "pairs": len(pairs),
            "dstui_mean": statistics.fmean(x for x, _ in pairs),
            "smi_mean": statistics.fmean(y for _, y in pairs),
            "mean_diff": statistics.fmean(d),
            "mean_abs_diff": statistics.fmean(abs(x) for x in d),
            "max_abs_diff": max(abs(x) for x in d),
        }
        out[what] = row
        print(
            f"{what:<16}{row['pairs']:>7}{row['dstui_mean']:>13.1f}{row['smi_mean']:>11.1f}"
            f"{row['mean_diff']:>11.2f}{row['mean_abs_diff']:>13.2f}{row['max_abs_diff']:>12.2f}"
        )
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
    return 0 if out else 1


if __name__ == "__main__":
    sys.exit(main())
