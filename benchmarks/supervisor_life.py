"""What a batch's detached processes cost over their whole life: CPU seconds each (helpers of supervisor_cost.py).

The supervisor (``dstui supervise``), its standby and the run wrappers are started
by ``dstui run`` in sessions of their own and outlive it, so no ``wait`` of the
benchmark ever sees them. Here the benchmark makes itself a *child subreaper*
(prctl PR_SET_CHILD_SUBREAPER): every process of the batch that is orphaned is
handed to it instead of init, and each one's own user+sys CPU is read when it has
exited (its /proc stat as a zombie, before it is reaped), with nothing added to
the product. A thread walks the
benchmark's process tree every 20 ms to learn what each pid is (its command
line is gone once it has exited).

``--breakdown`` adds two batches per tree with a ``sitecustomize`` on
PYTHONPATH that acts in the supervisor only: one re-executes it under
``-X importtime`` (its imports, by top-level package), one runs it under
cProfile (its functions, by cumulative time). Both slow the process down, so
their CPU is not counted with the plain batches.
"""

from __future__ import annotations

import ctypes
import os
import pstats
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
KINDS = (
    ("supervisor", re.compile(r"-m dstui supervise ")),
    ("standby", re.compile(r"dstui\.execute\.injob\.standby|dstui\.execute\.standby")),
    ("wrapper", re.compile(r"dstui\.execute\.injob\.wrap|dstui\.execute\.wrap")),
    ("runner", re.compile(r"fake_runner\.py|runners/")),
    ("dstui run", re.compile(r"-m dstui run ")),
)

SITECUSTOMIZE = '''
import os, sys
_argv = list(getattr(sys, "orig_argv", []))
_mode = os.environ.get("SUPCOST_MODE", "")
if "supervise" in _argv and "dstui" in _argv:
    if _mode == "importtime" and "importtime" not in sys._xoptions:
        os.execv(sys.executable, [sys.executable, "-X", "importtime", *_argv[1:]])
    elif _mode == "profile":
        import atexit, cProfile
        _prof = cProfile.Profile()
        def _dump():
            _prof.disable()
            _prof.dump_stats(os.path.join(os.environ["SUPCOST_OUT"], f"supervisor-{os.getpid()}.prof"))
        atexit.register(_dump)
        _prof.enable()
'''


def become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit(f"prctl(PR_SET_CHILD_SUBREAPER) failed: errno {ctypes.get_errno()}")


def kind_of(cmdline: str) -> str:
    for name, pattern in KINDS:
        if pattern.search(cmdline):
            return name
    return "other"


class TreeWatch:
    """Learns the command line of every descendant while it lives (a thread; 20 ms passes)."""

    def __init__(self) -> None:
        self.cmdlines: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> TreeWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _children(self, pid: int) -> list[int]:
        out: list[int] = []
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as fh:
                    out.extend(int(x) for x in fh.read().split())
        except (OSError, ValueError):
            pass
        return out

    def _loop(self) -> None:
        while not self._stop.is_set():
            todo = self._children(os.getpid())
            while todo:
                pid = todo.pop()
                try:  # read again each pass: between fork and exec a child shows its parent's command line
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        raw = fh.read()
                except OSError:
                    raw = b""
                if raw:  # empty for a zombie: the last one read stays
                    self.cmdlines[pid] = raw.replace(b"\0", b" ").decode(errors="replace")
                todo.extend(self._children(pid))
            self._stop.wait(0.02)


def reap_all(first: int, watch: TreeWatch, timeout: float) -> dict[str, list[float]]:
    """Wait for ``first`` (dstui run) and every orphan of the batch; CPU-s per process, by kind.

    A process's own CPU is read from its /proc stat while it is a zombie (``waitid`` with
    WNOWAIT), before it is reaped: ``wait4``'s figure would add its own children's (a
    supervisor's run wrappers and their jobs), reported apart as ``<kind> children``. A
    process of the batch that exits with a non-zero status stops the benchmark: a cheaper
    supervisor that fails is no result.
    """
    by_kind: dict[str, list[float]] = {}
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return by_kind  # nothing of the batch is left
        if info is None:
            time.sleep(0.02)
            continue
        own, children = zombie_cpu(info.si_pid)
        pid, status, _ = os.wait4(info.si_pid, 0)
        kind = "dstui run" if pid == first else kind_of(watch.cmdlines.get(pid, ""))
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{kind} (pid {pid}) exited with {os.waitstatus_to_exitcode(status)}: {by_kind}")
        by_kind.setdefault(kind, []).append(own)
        if children:
            by_kind.setdefault(f"{kind} children", []).append(children)
    raise SystemExit(f"the batch's processes did not all end in {timeout:.0f} s: {by_kind}")


def zombie_cpu(pid: int) -> tuple[float, float]:
    """(own user+sys, its waited-for children's user+sys) of an exited, not yet reaped process, in s."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    utime, stime, cutime, cstime = (int(x) / tick for x in fields[11:15])
    return round(utime + stime, 3), round(cutime + cstime, 3)


def empty_store(folder: Path) -> Path:
    """A migrated, empty MLflow store, made once: every home gets a copy, as a user's home has one after its
    first batch (and as the tests' homes do). A new store's migrations would otherwise dominate the figure."""
    folder.mkdir(parents=True)
    db = folder / "mlflow.db"
    subprocess.run([sys.executable, "-c", f"from mlflow import MlflowClient; MlflowClient('sqlite:///{db}').search_experiments()"],
                   check=True, capture_output=True)  # fmt: skip
    return db


def home_with(store: Path, home: Path) -> Path:
    (home / "mlruns").mkdir(parents=True)
    shutil.copy(store, home / "mlruns" / "mlflow.db")
    return home


def env_for(tree: Path, home: Path, extra_env: dict) -> dict[str, str]:
    """The environment of a `dstui` command of ``tree`` with its runs home in ``home``."""
    env = dict(os.environ, DSTUI_HOME=str(home), PYTHONPATH=os.pathsep.join([str(tree), *extra_env.pop("_path", [])]))
    env.pop("MLFLOW_TRACKING_URI", None)
    if env.get("PYTHONDONTWRITEBYTECODE") and not env.get("PYTHONPYCACHEPREFIX"):
        # what `dstui run` re-executes itself with here (dstui.execute.bytecode), set from the start: a tree
        # with no __pycache__ beside its sources (a new worktree) would otherwise compile the CLI's imports
        # from source before that re-exec, and a tree with one would not (0.1 CPU-s apart)
        cache = Path(os.environ.get("DSTUI_CACHE", Path.home() / ".cache" / "dstui")) / "bytecode"
        env["PYTHONPYCACHEPREFIX"] = str(cache)
    env.update(extra_env)
    return env


def run_batch(tree: Path, home: Path, spec: Path, extra_env: dict[str, str], timeout: float) -> dict[str, list[float]]:
    """One batch of ``spec`` through ``dstui run`` of ``tree`` (this venv's Python, the tree's dstui)."""
    env = env_for(tree, home, extra_env)
    log = home / "dstui-run.log"
    with TreeWatch() as watch, open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "dstui", "run", str(spec), "--quiet"],
                                cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        result = reap_all(proc.pid, watch, timeout)
    proc.returncode = 0  # reaped above; keep Popen from waiting again
    states = [p.read_text() for p in home.glob("runs/*/*/status.json")]
    if not states or not all('"done"' in s for s in states):
        raise SystemExit(f"batch in {home} did not end with every run done; see {log}")
    left = [p.name for p in (home / "mlruns").iterdir() if p.name.startswith("mlflow.db-")]
    if left:  # the last connection's close folds SQLite's log into the store: it must still happen
        raise SystemExit(f"the store's side files were left behind in {home / 'mlruns'}: {left}")
    return result


def import_breakdown(home: Path, top: int = 14) -> list[tuple[str, float]]:
    """Self time of the supervisor's imports summed by top-level package (from its -X importtime lines)."""
    text = "\n".join(p.read_text(errors="replace") for p in home.glob("runs/*/supervisor.log"))
    total: dict[str, float] = {}
    for m in re.finditer(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", text):
        pkg = m.group(2).split(".")[0]
        total[pkg] = total.get(pkg, 0.0) + int(m.group(1)) / 1e6
    return sorted(((k, round(v, 3)) for k, v in total.items()), key=lambda kv: -kv[1])[:top]


def profile_breakdown(out: Path, top: int = 25) -> str:
    files = sorted(out.glob("supervisor-*.prof"))
    if not files:
        return "(no profile written)"
    stats = pstats.Stats(str(files[0]), stream=(buf := _Buf()))
    stats.sort_stats("cumulative").print_stats(top)
    return buf.text


class _Buf:
    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> int:
        self.text += s
        return len(s)
