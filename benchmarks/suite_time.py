#!/usr/bin/env python
"""How long the test suite takes, and where its time goes (issue 17).

Runs the README's test command (``python -m pytest -n auto``, optionally the fast
loop ``-m "not e2e"``) as a child process and reports:

* the wall time and the CPU time of the processes it started that were waited for
  (workers, CLIs, DeepSpeed ranks): a lower bound, since detached supervisors and
  daemons are reparented and not counted; wall against CPU tells waiting from computing;
* the time per xdist group and per test file, from pytest's JUnit XML
  (a group runs whole on one worker, so the longest group bounds the wall time from below).

    python benchmarks/suite_time.py [--fast] [--workers N] [--fresh-home] [--log FILE] [-- extra pytest args]

``--fresh-home`` runs with an empty HOME (no JIT-op builds, DeepSpeed answers or
caches from earlier runs), as CI's fresh machine does. Prints a table and one JSON
object; docs/BENCHMARKS.md ("Test suite") records the results.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def group_of(name: str) -> str | None:
    """xdist names a grouped test ``test_x@group`` under loadgroup."""
    m = re.search(r"@([\w-]+)$", name)
    return m.group(1) if m else None


def read_junit(path: Path) -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
    """Seconds per group, seconds per file, and outcome counts."""
    groups: dict[str, float] = defaultdict(float)
    files: dict[str, float] = defaultdict(float)
    outcomes: dict[str, int] = defaultdict(int)
    for case in ET.parse(path).getroot().iter("testcase"):
        t = float(case.get("time") or 0)
        file = (case.get("classname") or "").replace(".", "/") + ".py"
        files[file] += t
        groups[group_of(case.get("name") or "") or "(ungrouped)"] += t
        kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        outcomes[kind] += 1
    return dict(groups), dict(files), dict(outcomes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fast", action="store_true", help='the inner loop: -m "not e2e"')
    ap.add_argument("--workers", default="auto", help="pytest-xdist -n (default: auto, tests/conftest.py decides)")
    ap.add_argument("--fresh-home", action="store_true", help="an empty HOME, like CI's fresh machine")
    ap.add_argument("--log", type=Path, help="also write pytest's whole output here")
    ap.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="dstui-suite-") as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-n", args.workers, "-q", f"--junitxml={junit}"]  # the bisect tests use pytest's cache
        if args.fast:
            cmd += ["-m", "not e2e"]
        cmd += args.pytest_args
        env = dict(os.environ, CI="true")
        if args.fresh_home:
            home = Path(tmp) / "home"
            home.mkdir()
            pip_conf = Path.home() / ".config" / "pip" / "pip.conf"
            if pip_conf.exists():  # package indexes stay where the user configured them
                env.setdefault("PIP_CONFIG_FILE", str(pip_conf))
            env["HOME"] = str(home)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.monotonic()
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        wall = time.monotonic() - start
        if args.log:
            args.log.write_text(proc.stdout + proc.stderr)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if not junit.exists():
            print(proc.stdout[-3000:] + proc.stderr[-3000:], file=sys.stderr)
            return proc.returncode or 1
        groups, files, outcomes = read_junit(junit)

    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    cores = len(os.sched_getaffinity(0))
    print(f"{' '.join(cmd[1:])}\nexit {proc.returncode}; {dict(outcomes)}")
    for line in proc.stdout.splitlines():  # what failed, as pytest's short summary names it
        if line.startswith(("FAILED", "ERROR")):
            print(line[:300])
    print(f"wall {wall:.0f} s; CPU {cpu:.0f} s over {cores} cores (the CPU alone needs >= {cpu / cores:.0f} s)")
    print("\n| xdist group | test seconds |\n| --- | --- |")
    for name, t in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {t:.0f} |")
    print("\n| file | test seconds |\n| --- | --- |")
    for name, t in sorted(files.items(), key=lambda kv: -kv[1])[:15]:
        print(f"| {name} | {t:.0f} |")
    print(json.dumps({"command": cmd[1:], "exit": proc.returncode, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
                      "cores": cores, "outcomes": outcomes, "groups_s": {k: round(v, 1) for k, v in groups.items()}}))  # fmt: skip
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
