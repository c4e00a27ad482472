#!/usr/bin/env python
"""What watching one live run costs the machine: the supervisor's CPU time and disk syncs.

The cost-of-watching goal (issue 8: a watched run at most 1% slower than the
same run unwatched) was missed once on a GPU with a host-bound 80 ms step
(docs/gpu-validation/README.md). The GPU cannot be had for every change, so
this script measures the mechanism on any machine instead: a stand-in runner
(tests/programs/fake_runner.py) writes one step record every --step-s seconds
through `dstui run`, and the detached supervisor that follows it is measured:

* CPU seconds it used per second of the run (psutil), i.e. the share of one
  core that watching takes away from the training processes;
* with --strace, the file-system syscalls it made per minute (fsync/fdatasync,
  renames, file writes), counted by `strace -f -c` attached to it. Each fsync
  forces a journal commit that other writers on the same disk may wait for.
  strace slows the traced process, so CPU figures come from the run without it.

    python benchmarks/supervisor_cost.py [--seconds 60] [--step-s 0.08] [--strace]

``--life N`` measures instead what a short batch's processes cost over their
whole life (issue 39: ~140 supervisors in a suite run, ~2.8 CPU-s each): N
rounds of a two-run batch of the stand-in runner through ``dstui run``, each
detached process's own user+sys CPU taken by ``wait4`` as a child subreaper
(benchmarks/supervisor_life.py). ``--tree DIR`` (repeatable) measures other
checkouts too, interleaved round by round with this one on the same Python
(e.g. ``git worktree add /tmp/sv-base main``); ``--breakdown`` adds the
supervisor's imports (-X importtime) and a cProfile of it per tree:

    python benchmarks/supervisor_cost.py --life 5 --tree /tmp/sv-base --breakdown

Prints one JSON object (and the profiles); docs/BENCHMARKS.md records the results.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import supervisor_life as life  # noqa: E402 - the benchmark's folder on the path first

REPO = Path(__file__).resolve().parents[1]
FAKE = REPO / "tests" / "programs" / "fake_runner.py"
COUNTED = ("fsync", "fdatasync", "rename", "renameat", "renameat2", "write", "pwrite64", "openat")


def spec_for(tmp: Path, steps: int, step_s: float, runs: int = 1) -> Path:
    spec = {
        "name": "supervisor-cost",
        "settings": {
            "kind": "command",
            "metrics_format": "jsonl",
            "steps": steps,
            "warmup_steps": 1,
        },
        "conditions": [
            {
                "name": "fake",
                "command": [
                    "{python}",
                    str(FAKE),
                    "--metrics-file",
                    "{metrics_file}",
                    "--steps",
                    str(steps),
                    "--interval",
                    str(step_s),
                ],
            }  # fmt: skip
        ],
    }
    if runs > 1:  # one condition per run: the same program, a label apart
        base = spec["conditions"][0]
        spec["conditions"] = [{**base, "name": f"fake{i}"} for i in range(runs)]
    path = tmp / "supervisor-cost.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def supervisor_pid(batch: Path, timeout: float = 30.0) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            m = re.match(r"pid (\d+)", (batch / "supervisor.lock").read_text())
            if m:
                return int(m.group(1))
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"no supervisor appeared for {batch}")


def run_state(batch: Path) -> str:
    """The run's state; "tracked" once it runs and its MLflow run exists (the supervisor launches first,
    then imports MLflow and makes the run: a window opened at "running" would count that start)."""
    try:
        st = json.loads((batch / "fake-r0" / "status.json").read_text())
    except (OSError, ValueError):
        return "?"
    return "tracked" if st.get("state") == "running" and st.get("mlflow_run_id") else str(st.get("state", "?"))


def strace_counts(text: str) -> dict[str, int]:
    """Calls per syscall from `strace -c` output (the 'calls' column)."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        # % time, seconds, usecs/call, calls, [errors], syscall
        if len(parts) >= 5 and parts[-1] in COUNTED and parts[3].isdigit():
            counts[parts[-1]] = int(parts[3])
    return counts


def measure(home: Path, spec: Path, seconds: float, trace: bool, tree: Path = REPO) -> dict:
    env = life.env_for(tree, home, {})
    subprocess.run(
        [sys.executable, "-m", "dstui", "run", str(spec), "--detach", "--quiet"],
        env=env, check=True, capture_output=True, timeout=120, cwd=tree,
    )  # fmt: skip
    batch = max((home / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    pid = supervisor_pid(batch)
    proc = psutil.Process(pid)
    # measure only while the run is live and tracked: from its MLflow run on
    deadline = time.time() + 60
    while run_state(batch) != "tracked" and time.time() < deadline:
        time.sleep(0.05)
    tracer = None
    if trace:
        tracer = subprocess.Popen(
            ["strace", "-f", "-c", "-e", "trace=" + ",".join(COUNTED), "-p", str(pid)],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        time.sleep(0.5)
    c0, t0 = proc.cpu_times(), time.time()
    time.sleep(seconds)
    c1, t1 = proc.cpu_times(), time.time()
    out: dict = {"window_s": round(t1 - t0, 2), "state_after_window": run_state(batch)}
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    out["cpu_s"] = round(cpu, 3)
    out["cpu_share_of_one_core_pct"] = round(100 * cpu / (t1 - t0), 2)
    if tracer is not None:
        tracer.send_signal(2)  # SIGINT: strace detaches and prints its table
        _, err = tracer.communicate(timeout=30)
        counts = strace_counts(err)
        out["syscalls_per_min"] = {
            k: round(v * 60 / (t1 - t0), 1) for k, v in sorted(counts.items())
        }
    subprocess.run(
        [sys.executable, "-m", "dstui", "cancel", str(batch / "fake-r0")],
        env=env,
        capture_output=True,
        timeout=60,
    )
    with contextlib.suppress(psutil.Error):
        proc.wait(timeout=30)  # the supervisor settles the run and exits before its folder goes
    return out


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return round((xs[n // 2] + xs[(n - 1) // 2]) / 2, 3) if xs else float("nan")


def measure_life(trees: list[Path], rounds: int, runs: int, breakdown: bool, keep: Path | None = None) -> dict:
    """Round by round, one batch per tree: CPU-s of each detached process, medians by kind."""
    per_tree: dict[str, dict[str, list[float]]] = {str(t): {} for t in trees}
    out: dict = {"runs_per_batch": runs, "rounds": rounds}
    life.become_subreaper()
    with tempfile.TemporaryDirectory(prefix="dstui-suplife-") as tmp:
        t = Path(tmp)
        spec = spec_for(t, steps=20, step_s=0.05, runs=runs)
        store = life.empty_store(t / "template")
        for r in range(rounds):
            for i, tree in enumerate(trees):
                got = life.run_batch(tree, life.home_with(store, t / f"home-{i}-{r}"), spec, {}, timeout=300)
                for kind, cpus in got.items():
                    per_tree[str(tree)].setdefault(kind, []).extend(cpus)
                print(f"round {r + 1} {tree}: {got}", file=sys.stderr, flush=True)
        out["cpu_s_median"] = {
            tree: {k: median(v) for k, v in sorted(kinds.items())} for tree, kinds in per_tree.items()
        }
        out["cpu_s_all"] = per_tree
        if breakdown:
            where = keep or t
            out["breakdown"] = {str(tree): breakdown_of(tree, where / f"bd-{i}", spec, store) for i, tree in enumerate(trees)}
    return out


def breakdown_of(tree: Path, where: Path, spec: Path, store: Path) -> dict:
    """One batch with the supervisor under -X importtime, one under cProfile (sitecustomize.py)."""
    hook = where / "hook"
    hook.mkdir(parents=True)
    (hook / "sitecustomize.py").write_text(life.SITECUSTOMIZE)
    env = {"SUPCOST_MODE": "importtime", "_path": [str(hook)]}
    life.run_batch(tree, life.home_with(store, where / "imports"), spec, env, timeout=300)  # type: ignore[arg-type]
    profiles = where / "profiles"
    profiles.mkdir()
    env = {"SUPCOST_MODE": "profile", "SUPCOST_OUT": str(profiles), "_path": [str(hook)]}
    life.run_batch(tree, life.home_with(store, where / "profile"), spec, env, timeout=300)  # type: ignore[arg-type]
    text = life.profile_breakdown(profiles)
    print(f"---- cProfile of the supervisor, {tree} ----\n{text}", file=sys.stderr)
    return {"import_self_s_by_package": life.import_breakdown(where / "imports")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--seconds", type=float, default=60.0, help="measurement window while the run is live"
    )
    ap.add_argument(
        "--step-s",
        type=float,
        default=0.08,
        help="seconds between step records (80 ms: the GPU case)",
    )
    ap.add_argument(
        "--strace", action="store_true", help="also count file-system syscalls (needs strace)"
    )
    ap.add_argument("--life", type=int, default=0, metavar="ROUNDS",
                    help="measure whole-life CPU of a short batch's processes, this many rounds")  # fmt: skip
    ap.add_argument("--runs", type=int, default=2, help="--life: runs per batch (one condition each)")
    ap.add_argument("--tree", action="append", type=Path, default=[],
                    help="another checkout to measure too (--life: interleaved round by round; repeatable)")  # fmt: skip
    ap.add_argument("--breakdown", action="store_true", help="--life: the supervisor's imports and profile")
    ap.add_argument("--keep", type=Path, help="--breakdown: keep its homes, logs and profiles in this new folder")
    a = ap.parse_args(argv)
    if a.life:
        trees = [REPO, *(t.resolve() for t in a.tree)]
        result = {"bench": "supervisor_life", **measure_life(trees, a.life, a.runs, a.breakdown, a.keep)}
        print(json.dumps(result, indent=1))
        return 0
    if a.strace and shutil.which("strace") is None:
        raise SystemExit("--strace needs strace (apt-get install strace)")
    steps = int((a.seconds + 40) / a.step_s)  # outlasts start-up and the window
    result: dict = {
        "bench": "supervisor_cost",
        "step_s": a.step_s,
        "steps_per_s": round(1 / a.step_s, 2),
    }
    with tempfile.TemporaryDirectory(prefix="dstui-supcost-") as tmp:
        t = Path(tmp)
        spec = spec_for(t, steps, a.step_s)
        result["cpu"] = measure(t / "home-cpu", spec, a.seconds, trace=False)
        for i, tree in enumerate(a.tree):  # other checkouts, one window each after this one's
            result[f"cpu {tree}"] = measure(t / f"home-cpu-{i}", spec, a.seconds, trace=False, tree=tree.resolve())
        if a.strace:
            result["syscalls"] = measure(t / "home-strace", spec, a.seconds, trace=True)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
