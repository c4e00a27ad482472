#!/usr/bin/env python3
"""A newcomer's first result: fresh clone -> `.ci/with-env dstui demo` -> the first run done (issue 38.6).

Clones a commit of this repository into a temporary folder and runs the README's
first command there, headless, with every cache a fresh machine would lack made
empty (pip's, uv's, torch's JIT ops, dstui's: ``XDG_CACHE_HOME``, ``DSTUI_CACHE``,
``XDG_DATA_HOME`` point into the temporary folder). Times, from the start of
``.ci/with-env``:

- install: until its install stamp is written (venv, torch, dstui and extras);
- first run done: until the first run of the demo's batch reaches ``done``.

The machine here is shared, so wall time moves with other people's load: the
script also reports the load average over the measurement and the CPU seconds
that the clone's processes used (all of them: it makes itself their child
subreaper, so the detached supervisor and the ranks are counted too), which load
distorts less. The rest of the demo's batch is cancelled once the first run is
done, and every process it started is waited for.

    python3 benchmarks/first_result.py                 # this checkout's HEAD
    python3 benchmarks/first_result.py --ref main      # another commit, for a before/after
    python3 benchmarks/first_result.py --json out.json

Standard library only: it runs before any environment exists.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
TICK_S = 0.2
PR_SET_CHILD_SUBREAPER = 36
CLK_TCK = os.sysconf("SC_CLK_TCK")


def become_subreaper() -> bool:
    """Orphaned descendants (the detached supervisor, the ranks) are re-parented to us, so we count them."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds of the process and its reaped children) from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # after the name: state ppid ... utime(11) stime(12) cutime(13) cstime(14), counted from 0 at state
    return int(fields[1]), sum(int(x) for x in fields[11:15]) / CLK_TCK


def descendants() -> dict[int, float]:
    """Live descendants of this process: pid -> CPU seconds (their own and their reaped children's)."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None:
            table[int(entry.name)] = st
    me, found = os.getpid(), {}
    for pid in table:
        p, seen = pid, 0
        while p in table and p != me and seen < 64:
            p, seen = table[p][0], seen + 1
        if p == me and pid != me:
            found[pid] = table[pid][1]
    return found


def cpu_seconds() -> float:
    """CPU seconds of everything started here: reaped children (rusage) plus the live ones (/proc)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime + sum(descendants().values())


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def fresh_env(tmp: Path) -> dict[str, str]:
    """This environment without any venv or dstui state, its caches empty (a fresh machine's)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DSTUI_", "MLFLOW_", "UV_", "VIRTUAL_ENV", "TORCH_EXTENSIONS", "PYTHONPYCACHEPREFIX"))}  # fmt: skip
    venv = os.environ.get("VIRTUAL_ENV")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if not (venv and p.startswith(venv)))
    for name, sub in (("XDG_CACHE_HOME", "cache"), ("XDG_DATA_HOME", "data"), ("DSTUI_CACHE", "cache/dstui")):
        env[name] = str(tmp / sub)
        (tmp / sub).mkdir(parents=True, exist_ok=True)
    return env


def first_done(runs_root: Path) -> tuple[str, dict] | None:
    """(batch id, status) of the first run of any batch that is done."""
    for st_file in runs_root.glob("*/*/status.json"):
        try:
            st = json.loads(st_file.read_text())
        except (OSError, ValueError):
            continue
        if st.get("state") == "done":
            return st_file.parent.parent.name, st
        if st.get("state") in ("failed", "killed"):
            raise SystemExit(f"first_result: run {st_file.parent.name} ended {st.get('state')}: {st.get('reason')}")
    return None


def stop_the_rest(clone: Path, env: dict[str, str], batch: str | None, demo: subprocess.Popen) -> None:
    """Cancel the demo's other runs, end the demo's follower, wait for every process started here."""
    dstui = clone / ".venv" / "bin" / "dstui"
    if batch and dstui.exists():
        subprocess.run([str(dstui), "cancel", batch], cwd=clone, env=env, capture_output=True, timeout=120, check=False)
    if demo.poll() is None:
        os.killpg(demo.pid, signal.SIGINT)  # the demo's follower: Ctrl-C leaves the runs, which are cancelled
    end = time.monotonic() + 120
    while descendants() and time.monotonic() < end:
        reap()
        time.sleep(0.5)
    for pid in descendants():  # still here after two minutes: only ever our own descendants
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    reap()


def measure(ref: str, keep: bool) -> dict:
    if not become_subreaper():
        print("first_result: cannot become a child subreaper; detached processes' CPU is not counted", file=sys.stderr)
    tmp = Path(tempfile.mkdtemp(prefix="dstui-first-"))
    clone = tmp / "dstui"
    env = fresh_env(tmp)
    t0 = time.monotonic()
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(HERE), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", ref], check=True)
    sha = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         check=True).stdout.strip()  # fmt: skip
    clone_s = time.monotonic() - t0
    log = (tmp / "demo.log").open("wb")
    loads: list[float] = []
    cpu0 = cpu_seconds()
    start = time.monotonic()
    demo = subprocess.Popen([str(clone / ".ci" / "with-env"), "dstui", "demo", "--no-tui"], cwd=clone, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    stamp = clone / ".venv" / ".dstui-installed"
    runs_root = tmp / "data" / "dstui" / "runs"
    install_s = install_cpu = None
    found = None
    last_load = 0.0
    try:
        while found is None:
            now = time.monotonic()
            if now - last_load >= 1.0:
                loads.append(os.getloadavg()[0])
                last_load = now
            if install_s is None and stamp.exists():
                install_s, install_cpu = now - start, cpu_seconds() - cpu0
            found = first_done(runs_root)
            if found is None and demo.poll() is not None:
                raise SystemExit(f"first_result: the demo ended ({demo.returncode}) before a run was done; see {tmp / 'demo.log'}")
            if found is None:
                time.sleep(TICK_S)
        first_s, first_cpu = time.monotonic() - start, cpu_seconds() - cpu0
    finally:
        stop_the_rest(clone, env, found[0] if found else None, demo)
        log.close()
    batch, st = found
    result = {
        "ref": ref, "commit": sha, "cores": os.cpu_count(), "clone_s": round(clone_s, 1),
        "install_s": round(install_s, 1) if install_s is not None else None,
        "install_cpu_s": round(install_cpu, 1) if install_cpu is not None else None,
        "first_run_done_s": round(first_s, 1), "first_run_done_cpu_s": round(first_cpu, 1),
        "demo_s": round(first_s - (install_s or 0.0), 1),
        "demo_cpu_s": round(first_cpu - (install_cpu or 0.0), 1),
        "load_1min_mean": round(sum(loads) / len(loads), 1) if loads else None,
        "load_1min_max": round(max(loads), 1) if loads else None,
        "first_run": st.get("name"), "first_run_phases": {k: round(v, 1) for k, v in (st.get("phases") or {}).items()
                                                          if isinstance(v, (int, float))},  # fmt: skip
        "batch": batch,
    }
    if keep:
        result["folder"] = str(tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", default="HEAD", help="the commit to clone (default: this checkout's HEAD)")
    ap.add_argument("--json", metavar="FILE", help="also write the result as JSON")
    ap.add_argument("--keep", action="store_true", help="keep the temporary clone and its log")
    args = ap.parse_args()
    r = measure(args.ref, args.keep)
    print(f"{r['ref']} ({r['commit']}) on {r['cores']} cores, load {r['load_1min_mean']} mean / {r['load_1min_max']} max:")
    print(f"  install (venv + deps)   {r['install_s']:>6} s wall  {r['install_cpu_s']:>6} CPU-s")
    print(f"  demo to first run done  {r['demo_s']:>6} s wall  {r['demo_cpu_s']:>6} CPU-s")
    print(f"  total                   {r['first_run_done_s']:>6} s wall  {r['first_run_done_cpu_s']:>6} CPU-s")
    print(f"  first run {r['first_run']}: {r['first_run_phases']}")
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
