"""Plain helpers every test tier shares (no fixtures here: those live in the conftest files)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SPECS = REPO / "configs" / "experiments"

#: the modules that import DeepSpeed and transformers in-process (unit/test_forecast,
#: unit/test_ds_answers, tui/test_tui_compose) run on one xdist worker, so one worker pays
#: those imports rather than each (~3 CPU-s a worker)
IMPORTS_DEEPSPEED = pytest.mark.xdist_group("imports-deepspeed")

#: a test that costs 2 CPU-seconds or more (a long Pilot session of Compose or Results, a fuzzer
#: over a real MLflow store, a subprocess that imports transformers) runs in the full suite and
#: not in the `-m "not e2e"` fast loop: the fast loop is CPU-bound on 2 cores, and these ~40 tests
#: were 60% of its CPU (benchmarks/cpu_per_test.py measures each test; docs/BENCHMARKS.md)
HEAVY = pytest.mark.e2e


class RunnerModule:
    """A module of runners/, imported at its first attribute use.

    parity, parity_tolerance and parity_options import torch (~1.2 CPU-s): imported at module
    level by a test file, every xdist worker paid it while collecting, whichever ran the tests.
    """

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        import importlib

        runners = str(REPO / "runners")
        if runners not in sys.path:
            sys.path.insert(0, runners)
        return getattr(importlib.import_module(self._name), attr)


def dstui(*args: str, timeout: float = 600, check: bool = False, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would."""
    proc = subprocess.run(
        [sys.executable, "-m", "dstui", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"dstui {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def mlflow_client(uri: str | None = None):
    from mlflow import MlflowClient

    return MlflowClient(uri or os.environ["MLFLOW_TRACKING_URI"])


def batch_in_store(home: Path, batch_id: str) -> tuple[str, str]:
    """A finished one-run batch in ``home`` whose run is in the store (what `dstui ui` links to): (experiment id, run id)."""
    from dstui.core.rundir import BatchDir, RunDir, merge_status, write_json_atomic

    c = mlflow_client()
    exp = c.create_experiment(batch_id.split("-")[0])
    run_id = c.create_run(exp).info.run_id
    b = BatchDir(home / "runs" / batch_id)
    merge_status(RunDir(b.path / "a-r0"), dict(name="a-r0", state="done", mlflow_run_id=run_id))
    write_json_atomic(b.batch_file, {"id": b.id, "runs": ["a-r0"], "created": 1.0, "finalized": True})
    return exp, run_id


def session_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temp folder of this whole test session: shared by every xdist worker (each has its own below it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], dict]) -> dict:
    """``make(folder)`` once per test session, whichever worker asks first; the others wait and read its result.

    A session fixture is per xdist worker: a real batch shared by tests on two workers would run
    twice. Here the first caller runs it under a file lock, in ``folder``, and records the JSON
    result (or that it failed: later callers fail alike instead of running it again).
    """
    root = session_root(tmp_path_factory)
    folder = root / f"shared-{name}"
    done = root / f"shared-{name}.json"
    with open(root / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            folder.mkdir(exist_ok=True)
            try:
                result = {"ok": make(folder)}
            except BaseException as e:
                done.write_text(json.dumps({"error": f"{type(e).__name__}: {e}"}))
                raise
            done.write_text(json.dumps(result))
    result = json.loads(done.read_text())
    if "error" in result:
        pytest.fail(f"shared {name} failed in another test: {result['error']}")
    return result["ok"]


def compiler_cache_env(root: Path) -> dict[str, str]:
    """Environment that puts ccache in front of the C++ compiler for DeepSpeed's JIT op builds ({} without ccache).

    tests/conftest.py sets it for the whole session (``root``: the session's temp folder). Each
    revision env JIT-builds DeepSpeed's CPU shm op into its own folder (~60 CPU-seconds on
    2 cores), from sources that are identical across releases (0.18.0 to 0.18.2 here), and the
    installed DeepSpeed's ops are built once per op folder. With ``CCACHE_BASEDIR`` over the
    session's temp folder the command lines of two envs match (paths relative to the build
    folder), so the second build of the same sources is a cache hit: the same object files,
    seconds instead of minutes. Every process must see the same ``CXX``: ninja rebuilds an op
    whose command line changed (seen: the shm op built three times in one run when only the
    revision tests used ccache). The cache lives for this session only.
    """
    ccache = shutil.which("ccache")
    if ccache is None or os.environ.get("CXX"):
        return {}
    wrapper = root / "ccache-bin" / "c++"  # ccache run as "c++" calls the next c++ on PATH
    wrapper.parent.mkdir(exist_ok=True)
    with contextlib.suppress(FileExistsError):
        wrapper.symlink_to(ccache)
    return {"CXX": str(wrapper), "CCACHE_DIR": str(root / "ccache"), "CCACHE_BASEDIR": str(root)}


def fuzz_examples(full: int) -> int:
    """How many examples a costly property test runs: all of them in the full suite (CI, the
    README's command), a quarter in the `-m "not e2e"` day-to-day loop; FUZZ_N overrides both.

    The ingest fuzz's 500 examples write to a real MLflow store (~90 ms each); a quarter of them
    still cover every hostile kind many times over while a developer iterates.
    """
    if os.environ.get("FUZZ_N"):
        return int(os.environ["FUZZ_N"])
    return max(25, full // 4) if os.environ.get("DSTUI_TEST_FAST_LOOP") else full


@contextlib.contextmanager
def sink_store(root: Path, empty_db: Path, name: str) -> Iterator[dict]:
    """A real SQLite MLflow store under ``root`` (a copy of the session's empty one), a batch folder
    and the supervisor's MLflow sink on it, with DSTUI_HOME and the tracking URI set meanwhile: what
    the ingestion tests feed runs' output through. Yields root, uri, batch, sink and a client."""
    from dstui.core.rundir import BatchDir, write_json_atomic
    from dstui.execute.sink import MlflowSink

    (root / "mlruns").mkdir()
    shutil.copy(empty_db, root / "mlruns" / "mlflow.db")
    uri = f"sqlite:///{root}/mlruns/mlflow.db"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DSTUI_HOME", str(root))
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        batch = BatchDir(root / "runs" / f"{name}-b")
        batch.path.mkdir(parents=True)
        write_json_atomic(batch.batch_file, {"experiment": name, "runs": [], "created": time.time()})
        sink = MlflowSink(batch, uri, flush_interval_s=0.0)
        assert sink.client() is not None
        from mlflow import MlflowClient

        yield {"root": root, "uri": uri, "batch": batch, "sink": sink, "client": MlflowClient(uri)}


TEST_GIT_ENV = {
    "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
}  # fmt: skip


def git_at(repo: Path, *args: str, date: int | None = None) -> str:
    """git in ``repo`` as a fixed test author; ``date`` (hours after a fixed instant) makes the shas
    the same in every session, so histories built under the pytest cache stay valid."""
    env = {**os.environ, **TEST_GIT_ENV}
    if date is not None:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = f"{1700000000 + date * 3600} +0000"
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "commit.gpgsign=false", *args],
        capture_output=True, text=True, check=True, env=env,
    ).stdout.strip()


def wait_until(pred: Callable[[], object], timeout: float = 180, every: float = 0.2, what: str = "condition") -> object:
    """``pred()``'s first truthy value, polled every ``every`` s; an AssertionError naming ``what`` after ``timeout``.

    Tests wait on a condition, never a fixed sleep: under load a clock guesses wrong (issue 39).
    """
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def first_batch(home: Path) -> object:
    """The first batch under ``home/runs`` once there is one."""
    from dstui.core.rundir import list_batches

    return wait_until(lambda: (list_batches(home / "runs") or [None])[0], what="a batch")
