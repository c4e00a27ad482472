#!/usr/bin/env python
"""What the first-step probe (benchmarks/gpu/probe) found, contender by contender (issue 31).

    python benchmarks/gpu/probe_summary.py PROBE_DIR [--tables]

One line per probed rank: GPU work pending when step 1 began, its forward, backward and optimizer
step (each synchronized); then the switches and environment variables on which contenders differ.
``--tables`` adds each contender's first torch.profiler table (self CUDA time).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("probe", type=Path)
    p.add_argument("--tables", action="store_true")
    a = p.parse_args()
    recs = []
    for f in sorted(a.probe.glob("*/probe-*.json")):
        rec = json.loads(f.read_text())
        rec["who"] = f.parent.name
        recs.append(rec)
    if not recs:
        print(f"no probe files under {a.probe}")
        return 3
    keys = ("pending_s", "sdpa_first_s", "sdpa_second_s", "forward_s", "backward_s", "step_s")
    print(f"{'who':14} " + " ".join(f"{k[:-2]:>12}" for k in keys) + "  jit cache files before->after  load")
    for r in recs:
        cells = " ".join(f"{r.get(k, float('nan')):12.3f}" for k in keys)
        jit = f"{r.get('jit_cache_before', {}).get('files')}->{r.get('jit_cache_after', {}).get('files')}"
        print(f"{r['who']:14} {cells}  {jit:>10}  {r.get('process', {}).get('loadavg')}")
    for part in ("torch_before", "process", "env"):
        keys = sorted({k for r in recs for k in r.get(part, {})})
        differ = [k for k in keys if len({json.dumps(r.get(part, {}).get(k)) for r in recs}) > 1]
        print(f"\n{part}: differing {len(differ)} of {len(keys)}")
        for k in differ:
            vals = {}
            for r in recs:
                vals.setdefault(r["who"].rsplit("-", 1)[0], set()).add(str(r.get(part, {}).get(k))[:120])
            print(f"  {k}: " + "; ".join(f"{who}={'|'.join(sorted(v))}" for who, v in vals.items()))
    if a.tables:
        seen = set()
        for r in recs:
            who = r["who"].rsplit("-", 1)[0]
            if who in seen or "profile" not in r:
                continue
            seen.add(who)
            print(f"\n== {r['who']} (self CUDA time)\n{r['profile']['by_self_cuda']}")
            print(f"\n== {r['who']} (self CPU time)\n{r['profile']['by_self_cpu']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
