#!/usr/bin/env python
"""The CPU each test costs, whatever the machine's load: a pytest plugin and its summary.

Wall times of a test on a shared 2-core machine say more about the neighbours than
about the test (the same fast loop: 2:42 in CI, 12:34 here beside other
suites). The CPU a test's own process and the children it waited for spent is close
to the same under any load, so that is what this records, with the wall time beside it:

    PYTHONPATH=benchmarks DSTUI_CPU_PER_TEST=/tmp/cpu.jsonl \\
        .ci/with-env python -m pytest -p cpu_per_test -n auto -m "not e2e"
    .ci/with-env python benchmarks/cpu_per_test.py /tmp/cpu.jsonl [--top 40]

Each test (setup, call and teardown together) appends one JSON line: its node id,
the worker, CPU seconds of the test's process (``self``) and of the children it
waited for (``children``; a detached supervisor is not counted), wall seconds.
The summary prints the costliest tests, the costliest files and the totals;
what the workers spent outside any test (start-up, imports, collection) is the
process CPU the ``time`` of the whole run reports less the sum here.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    out = os.environ.get("DSTUI_CPU_PER_TEST")
    own0, kids0 = _cpu()
    t0 = time.monotonic()
    yield
    if not out:
        return
    own1, kids1 = _cpu()
    rec = {"test": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
           "self": round(own1 - own0, 3), "children": round(kids1 - kids0, 3), "wall": round(time.monotonic() - t0, 3)}  # fmt: skip
    with open(out, "a") as fh:  # one short line per write: appends from several workers stay whole
        fh.write(json.dumps(rec) + "\n")


def summarize(records: list[dict[str, Any]], top: int) -> str:
    cpu = {r["test"]: r["self"] + r["children"] for r in records}
    wall = {r["test"]: r["wall"] for r in records}
    by_file: dict[str, float] = defaultdict(float)
    for test, c in cpu.items():
        by_file[test.split("::")[0]] += c
    lines = [f"{len(records)} tests; CPU {sum(cpu.values()):.0f} s in the tests (self "
             f"{sum(r['self'] for r in records):.0f} s, waited-for children {sum(r['children'] for r in records):.0f} s); "
             f"wall {sum(wall.values()):.0f} test-seconds", "", "| test | CPU s | wall s |", "| --- | --- | --- |"]  # fmt: skip
    lines += [f"| {t} | {c:.1f} | {wall[t]:.1f} |" for t, c in sorted(cpu.items(), key=lambda kv: -kv[1])[:top]]
    lines += ["", "| file | CPU s |", "| --- | --- |"]
    lines += [f"| {f} | {c:.1f} |" for f, c in sorted(by_file.items(), key=lambda kv: -kv[1])[:top]]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", type=Path, help="the DSTUI_CPU_PER_TEST file of a run")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    records = [json.loads(line) for line in args.records.read_text().splitlines() if line.strip()]
    print(summarize(records, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
