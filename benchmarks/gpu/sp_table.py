#!/usr/bin/env python
"""A compact table of a sequence-parallel batch straight from its run folders (no MLflow needed).

Per run: mode, sp x dp, ZeRO stage, the fault injected (if any), mean step time after warm-up,
tokens/s, peak memory per GPU, the same three of the sp-check's no-SP run (same ranks and
sequence length, compiled the same way), what torch.compile compiled (graphs, graph breaks,
captured ops), the verdict, and its evidence: the tensor and loss margins, or the first layer
and stage that differed.

Below the table, each ``X-unchecked`` run (the condition ``X`` without ``sp_check``) against
``X``: the sp-check must not change what is compiled, so the four counts must be equal.

    python benchmarks/gpu/sp_table.py runs/sp-gpu-YYYYmmdd-HHMMSS [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

GIB = 1024**3


def load(run: Path) -> dict:
    """A run folder's settings, status and summaries (the training one and the sp-check's, merged)."""
    summary: dict = {}
    f = run / "metrics.jsonl"
    for line in f.read_text(errors="replace").splitlines() if f.is_file() else []:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("type") == "summary":
            summary.update({k: v for k, v in rec.items() if v is not None})
    def read(name: str) -> dict:
        p = run / name
        try:
            return json.loads(p.read_text()) if p.is_file() else {}
        except ValueError:
            return {}
    spec = read("spec.json")
    return {"name": run.name, "settings": spec.get("settings", spec), "status": read("status.json"), "summary": summary}


def _fault(settings: dict) -> str:
    args = settings.get("extra_args") or []
    return args[args.index("--sp-inject") + 1] if "--sp-inject" in args[:-1] else "-"


def _ms(x: object) -> str:
    return f"{x * 1000:.1f}" if isinstance(x, (int, float)) else "-"


def _num(x: object, spec: str) -> str:
    return format(x, spec) if isinstance(x, (int, float)) else "-"


def _evidence(s: dict) -> str:
    first = s.get("first_difference")
    if isinstance(first, dict):
        return f"layer {first.get('layer')}, {first.get('tensor')} {first.get('stage')}: rel {_num(first.get('rel'), '.3g')} > tol {_num(first.get('tol'), '.2g')}"
    if s.get("reason"):
        return str(s["reason"])[:160]
    if s.get("check") != "sp-check":
        return ""
    # a margin is None where the difference was exactly 0 (an infinite margin)
    tensors = "tensors identical" if not s.get("tensor_max_rel") else (
        f"tensors max rel {_num(s.get('tensor_max_rel'), '.2g')} (margin {_num(s.get('tensor_margin'), '.3g')})")
    loss = "losses identical" if s.get("margin") is None else f"loss margin {_num(s.get('margin'), '.3g')}"
    return f"{tensors}, {loss}"


COUNTS = ("dynamo_frames", "dynamo_graphs", "dynamo_graph_breaks", "dynamo_ops")


def _compiled(su: dict) -> str:
    if not any(k in su for k in COUNTS):
        return "-"
    return f"graphs {su.get('dynamo_graphs', 0)}, breaks {su.get('dynamo_graph_breaks', 0)}, ops {su.get('dynamo_ops', 0)}"


def same_graphs(loaded: list[dict]) -> list[str]:
    """One line per ``X-unchecked-rN`` run: its compile counts against ``X-rN``'s, and whether they are equal."""
    by_name = {r["name"]: r for r in loaded}
    out = []
    for name, r in by_name.items():
        cond, _, rep = name.rpartition("-")
        if not cond.endswith("-unchecked"):
            continue
        twin = by_name.get(f"{cond.removesuffix('-unchecked')}-{rep}")
        if twin is None:
            continue
        a, b = ({k: x["summary"].get(k) for k in COUNTS} for x in (twin, r))
        verdict = "same compiled graphs" if a == b and None not in a.values() else "DIFFERENT compile counts"
        out.append(f"{twin['name']} (sp-check on) vs {name} (off): {verdict}: {a} vs {b}")
    return out


def row(r: dict) -> dict:
    st, s, su = r["settings"], r["status"], r["summary"]
    sp = int(st.get("sequence_parallel") or 1)
    ranks = int(st.get("gpus") or 1) * int(st.get("nodes") or 1)
    return {
        "run": r["name"], "mode": (st.get("sp_mode") or "eager") if sp > 1 else "no SP", "sp_x_dp": f"{sp} x {max(1, ranks // sp)}",
        "zero": st.get("zero_stage"), "fault": _fault(st), "state": s.get("state", "?"),
        "step_ms": _ms(su.get("iter_time_mean")), "tokens_per_s": _num(su.get("tokens_per_s_mean"), ".0f"),
        "peak_gib": _num((su.get("mem_peak_max") or 0) / GIB if su.get("mem_peak_max") else None, ".2f"),
        "nosp": su.get("nosp_mode") or "-", "nosp_step_ms": _ms(su.get("nosp_iter_time_mean")),
        "nosp_tokens_per_s": _num(su.get("nosp_tokens_per_s_mean"), ".0f"),
        "nosp_peak_gib": _num(su.get("nosp_mem_peak_max") / GIB if su.get("nosp_mem_peak_max") else None, ".2f"),
        "compiled": _compiled(su),
        "verdict": s.get("verdict") or su.get("verdict") or ("-" if sp == 1 or not st.get("sp_check") else "?"), "evidence": _evidence(su) or s.get("reason") or "",
    }  # fmt: skip


HEAD = ["run", "mode", "sp_x_dp", "zero", "fault", "state", "step_ms", "tokens_per_s", "peak_gib", "nosp",
        "nosp_step_ms", "nosp_tokens_per_s", "nosp_peak_gib", "compiled", "verdict", "evidence"]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("batch", type=Path, help="the batch folder (runs/<spec>-<time>)")
    p.add_argument("--json", type=Path, help="also write the rows as JSON here")
    a = p.parse_args(argv)
    runs = sorted((d for d in a.batch.iterdir() if (d / "status.json").is_file()), key=lambda d: d.stat().st_mtime)
    loaded = [load(d) for d in runs]
    rows = [row(r) for r in loaded]
    print("| " + " | ".join(HEAD) + " |\n|" + "---|" * len(HEAD))
    for r in rows:
        print("| " + " | ".join(str(r[k]).replace("|", "/") for k in HEAD) + " |")
    graphs = same_graphs(loaded)
    for line in ["", *graphs] if graphs else []:
        print(line)
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "same_graphs": graphs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
