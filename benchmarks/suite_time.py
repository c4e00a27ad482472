#!/usr/bin/env python
"""How long the test suite takes, and where its time goes (issue 17).

Runs the README's test command (``python -m pytest -n auto``, optionally the fast
loop ``-m "not e2e"``) as a child process and reports:

* the wall time and the CPU time of the processes it started that were waited for
  (workers, CLIs, DeepSpeed ranks): a lower bound, since detached supervisors and
  daemons are reparented and not counted; wall against CPU tells waiting from computing;
* the time per xdist group and per test file, from pytest's JUnit XML
  (a group runs whole on one worker, so the longest group bounds the wall time from below);
* with ``--by-process``: the CPU of every Python process the suite started, by kind
  (``dstui run``, supervisor, DeepSpeed rank, pip, xdist worker, ...) and by the test that
  started it. A ``sitecustomize`` on PYTHONPATH records each process's own CPU as it exits
  (ranks leave through ``os._exit``, which it wraps); processes whose environment drops
  PYTHONPATH (pip's builds in revision envs) or that are killed are not counted.

    python benchmarks/suite_time.py [--fast] [--workers N] [--fresh-home] [--by-process] [--log FILE] [-- extra pytest args]

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


#: written as ``sitecustomize.py`` into a folder put first on PYTHONPATH (``--by-process``)
PROBE = """
import atexit, json, os, sys
def _record():
    t = os.times()
    rec = {"argv": sys.argv[:3], "cpu": t.user + t.system, "test": os.environ.get("PYTEST_CURRENT_TEST", "")}
    try:
        fd = os.open(os.environ["DSTUI_SUITE_PROBE_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, (json.dumps(rec) + "\\n").encode())
        os.close(fd)
    except (OSError, KeyError):
        pass
_done = []
def _once():
    if not _done:
        _done.append(1)
        _record()
atexit.register(_once)
_exit = os._exit
def _exit_recorded(code):
    _once()
    _exit(code)
os._exit = _exit_recorded
"""


def process_kind(argv: list[str]) -> str:
    """A short name for what a Python process was, from its first arguments."""
    first = argv[0] if argv else ""
    if first == "-c":
        return "xdist worker / python -c"
    name = Path(first).name
    if name == "__main__.py":  # python -m <package>
        package = Path(first).parent.name
        if package == "dstui" and len(argv) > 1:
            return f"dstui {argv[1]}"
        return f"python -m {package}" + (f" {argv[1]}" if package == "pip" and len(argv) > 1 else "")
    return name


def summarize_processes(log: Path) -> dict[str, dict[str, float]]:
    """CPU seconds and counts by process kind, and CPU seconds by the test file that started them."""
    kinds: dict[str, float] = defaultdict(float)
    counts: dict[str, float] = defaultdict(float)
    by_file: dict[str, float] = defaultdict(float)
    for line in log.read_text().splitlines() if log.exists() else []:
        rec = json.loads(line)
        kind = process_kind(rec["argv"])
        kinds[kind] += rec["cpu"]
        counts[kind] += 1
        by_file[rec["test"].split("::")[0] or "(no test)"] += rec["cpu"]
    return {"kinds": dict(kinds), "counts": dict(counts), "files": dict(by_file)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fast", action="store_true", help='the inner loop: -m "not e2e"')
    ap.add_argument("--workers", default="auto", help="pytest-xdist -n (default: auto, tests/conftest.py decides)")
    ap.add_argument("--fresh-home", action="store_true", help="an empty HOME, like CI's fresh machine")
    ap.add_argument("--by-process", action="store_true", help="the CPU of each Python process, by kind and by test")
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
        probe_log = Path(tmp) / "processes.jsonl"
        if args.by_process:
            probe = Path(tmp) / "probe"
            probe.mkdir()
            (probe / "sitecustomize.py").write_text(PROBE)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(probe), env.get("PYTHONPATH", "")) if p)
            env["DSTUI_SUITE_PROBE_LOG"] = str(probe_log)
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
        processes = summarize_processes(probe_log) if args.by_process else None

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
    if processes is not None:
        total = sum(processes["kinds"].values())
        print(f"\n| Python process | count | CPU s |\n| --- | --- | --- |\n| all recorded | "
              f"{sum(processes['counts'].values()):.0f} | {total:.0f} |")
        for name, t in sorted(processes["kinds"].items(), key=lambda kv: -kv[1])[:15]:
            print(f"| {name} | {processes['counts'][name]:.0f} | {t:.0f} |")
        print("\n| test file that started them | CPU s |\n| --- | --- |")
        for name, t in sorted(processes["files"].items(), key=lambda kv: -kv[1])[:15]:
            print(f"| {name} | {t:.0f} |")
    print(json.dumps({"command": cmd[1:], "exit": proc.returncode, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
                      "cores": cores, "outcomes": outcomes, "groups_s": {k: round(v, 1) for k, v in groups.items()},
                      "processes_cpu_s": processes and {k: round(v, 1) for k, v in processes["kinds"].items()}}))  # fmt: skip
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
