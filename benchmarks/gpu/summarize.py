#!/usr/bin/env python
"""Markdown tables of a batch's runs straight from their run folders (no MLflow needed).

Per run: state, iteration time mean +- std without warm-up, tokens/s per GPU, TFLOP/s
per GPU, MFU, peak memory, compile time (first step minus the median of the rest) and
the slowest later step (DeepCompile recompiles once), the step-1 and final losses and
the largest |loss - baseline loss| over the common steps.

    python benchmarks/gpu/summarize.py runs/gpu-validation-YYYYmmdd-HHMMSS [--baseline z0]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

GIB = 1024**3


def load(run: Path) -> dict:
    header, steps, summary = {}, [], {}
    f = run / "metrics.jsonl"
    if f.is_file():
        for line in f.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            kind = rec.get("type")
            if kind == "header":
                header = rec
            elif kind == "step":
                steps.append(rec)
            elif kind == "summary":
                summary = rec
    status = (
        json.loads((run / "status.json").read_text()) if (run / "status.json").is_file() else {}
    )
    return {
        "name": run.name,
        "header": header,
        "steps": steps,
        "summary": summary,
        "status": status,
    }


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def table(runs: list[dict], baseline: str | None) -> str:
    base = next(
        (r for r in runs if r["status"].get("condition") == baseline), runs[0] if runs else None
    )
    base_loss = {s["step"]: s["loss"] for s in base["steps"]} if base else {}
    lines = [
        "| run | state | iter time (ms) | tokens/s/GPU | TFLOP/s/GPU | MFU | peak mem (GiB) | compile (s) | slowest later step (s) | loss step 1 | final loss | max abs loss diff vs "
        + (base["name"] if base else "-")
        + " |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        s, h, st = r["summary"], r["header"], r["status"]
        world = h.get("world_size") or 1
        steps = r["steps"]
        later = [x["iter_time"] for x in steps[1:]]
        diffs = [abs(x["loss"] - base_loss[x["step"]]) for x in steps if x["step"] in base_loss]
        reason = f" ({st.get('reason')})" if st.get("reason") else ""
        lines.append(
            "| {name} | {state}{reason} | {it} | {tps} | {tf} | {mfu} | {mem} | {comp} | {slow} | {l1} | {lf} | {dl} |".format(
                name=r["name"],
                state=st.get("state", "?"),
                reason=reason,
                it=(
                    f"{s['iter_time_mean'] * 1e3:.1f} ± {s['iter_time_std'] * 1e3:.1f}"
                    if s.get("iter_time_mean")
                    else "-"
                ),
                tps=fmt(s.get("tokens_per_s_mean") and s["tokens_per_s_mean"] / world, ",.0f"),
                tf=fmt(s.get("tflops_per_gpu_mean"), ".1f"),
                mfu=fmt(s.get("mfu_mean") and 100 * s["mfu_mean"], ".1f")
                + ("%" if s.get("mfu_mean") else ""),
                mem=fmt(s.get("mem_peak_max") and s["mem_peak_max"] / GIB, ".1f"),
                comp=fmt(s.get("compile_time"), ".1f"),
                slow=fmt(max(later) if later else None, ".2f"),
                l1=fmt(steps[0]["loss"] if steps else None, ".4f"),
                lf=fmt(s.get("final_loss"), ".4f"),
                dl=fmt(max(diffs) if diffs and r is not base else None, ".2e"),
            )
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("batch", help="batch folder (runs/<batch>)")
    p.add_argument(
        "--baseline",
        default=None,
        help="condition the losses are compared with (default: first run)",
    )
    p.add_argument(
        "--json", default=None, help="also write the per-run data (no per-step lists) here"
    )
    a = p.parse_args(argv)
    runs = [load(d) for d in sorted(Path(a.batch).iterdir()) if (d / "status.json").is_file()]
    runs.sort(key=lambda r: r["status"].get("order", 0))
    if not runs:
        print(f"no runs in {a.batch}", file=sys.stderr)
        return 1
    h = next((r["header"] for r in runs if r["header"]), {})
    if h:
        v = h.get("versions", {})
        print(
            f"{h.get('gpu_count')}x {h.get('gpu_name')}; deepspeed {v.get('deepspeed')}, torch {v.get('torch')}, "
            f"transformers {v.get('transformers')}, python {v.get('python')}; params {h.get('params'):,}; "
            f"peak {h.get('peak_tflops')} TFLOP/s; tokens/step {h.get('tokens_per_step')}\n"
        )
    print(table(runs, a.baseline))
    if a.json:
        out = [
            {
                "name": r["name"],
                "summary": r["summary"],
                "status": {k: v for k, v in r["status"].items() if k != "argv"},
                "losses": [s["loss"] for s in r["steps"]],
                "iter_times": [s["iter_time"] for s in r["steps"]],
            }
            for r in runs
        ]
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
