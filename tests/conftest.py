"""Shared fixtures, and how the suite runs side by side.

Tiers by folder: ``unit/`` (no process launched unless marked e2e), ``tui/`` (Textual Pilot and
snapshots), ``e2e/`` (real processes: supervisors, DeepSpeed). Everything under ``e2e/`` is
marked ``e2e`` here, and so are the tests of the other tiers that cost 2 CPU-seconds or more
(``helpers.HEAVY``), so ``pytest -m "not e2e"`` is the fast inner loop.

Side by side (pytest-xdist, the README's ``-n auto``): most e2e tests wait on processes, daemons
and clocks far more than they compute, so several run at once. A module whose tests share
something one worker owns (a module-scoped batch, a Slurm cluster, a revision-env cache, counts
kept from one test to the next) says ``pytestmark = pytest.mark.xdist_group(NAME)``, and
``--dist loadgroup`` (pyproject's addopts) gives the whole group to one worker, in file order.
Under xdist the groups start longest first (:data:`LONGEST_FIRST`), so a long one is never left
for the end. Session fixtures belong to one worker; ``helpers.shared_once`` shares a result
between all of them.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

E2E_DIR = Path(__file__).resolve().parent / "e2e"

#: xdist groups in the order they start, the longest first (docs/BENCHMARKS.md, "Test suite
#: time", has their durations); ungrouped tests follow in file order
LONGEST_FIRST = (
    "tune", "compare-loss", "revisions", "bisect", "sp", "runner", "zero-init", "team-server", "slurm-nodes",
    "guard", "slurm", "source-env", "imports-deepspeed", "spec-fuzz", "argv-secrets", "smoke-batch",
)  # fmt: skip

#: how many workers ``-n auto`` starts per core: the full suite mostly waits on processes,
#: the fast loop (``-m "not e2e"``) mostly computes, with Textual's pauses between (on 2 cores:
#: 77 s with 2 workers, 66 s with 3, 73 s with 4; docs/BENCHMARKS.md)
WORKERS_PER_CORE = {"full": 2, "fast": 1.5}
MAX_WORKERS = 8


@pytest.hookimpl(trylast=True)  # after pytest's tmpdir plugin has made config._tmp_path_factory
def pytest_configure(config: pytest.Config) -> None:
    # `mlflow server` / `mlflow ui` (team-server, ui tests) would start MLflow's job runner and
    # seven Huey consumers, each importing mlflow (~20 CPU-seconds a server); dstui runs no
    # MLflow jobs, and the tests do not either
    os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    # The day-to-day loop (`-m "not e2e"`) runs the costliest fuzzers with fewer examples
    # (tests/helpers.py: fuzz_examples); the README's full command, which CI runs, all of them
    if "not e2e" in (config.option.markexpr or ""):
        os.environ.setdefault("DSTUI_TEST_FAST_LOOP", "1")
    # One intra-op thread per rank: DeepSpeed jobs run side by side here, and torch's default
    # (a thread per core) makes oversubscribed OpenMP threads spin. Two smoke batches at once
    # on 2 cores: 167 s and 206 CPU-s with the default, 94 s and 174 CPU-s with one thread.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Without DSTUI_HOME, dstui's runs home is ~/.local/share/dstui (dstui.core.paths): a test that
    # leaves it unset (a subprocess with a hand-made env, say) writes under the session's temp folder
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["XDG_DATA_HOME"] = str(config._tmp_path_factory.getbasetemp() / "xdg-data")  # noqa: SLF001 - pytest's own
        # dstui's cache (DeepSpeed's remembered answers, prebuilt-op records, bytecode, compile
        # caches, cwd links; dstui.core.paths.cache_dir) is the session's, as on CI's fresh machine:
        # an answer another session (or another dstui) left in ~/.cache/dstui never decides a test
        os.environ["DSTUI_CACHE"] = str(config._tmp_path_factory.getbasetemp() / "dstui-cache")  # noqa: SLF001
    # The machine's ledger of GPUs and cores (dstui.execute.gpu_ledger): a batch's runs wait while
    # another batch's runs use the cores. Tests run side by side on purpose, so each process (and
    # each test with a `home`) has its own; the machine's, shared by every user of this box, never.
    os.environ["DSTUI_GPU_LEDGER"] = str(config._tmp_path_factory.getbasetemp() / "machine-ledger")  # noqa: SLF001
    # Some images set PYTHONDONTWRITEBYTECODE=1 (this machine's does). The suite starts hundreds
    # of Python processes (xdist workers, CLIs, supervisors, ranks), and each would compile
    # dstui, runners/ and the rewritten test modules from source again; site-packages keep the
    # bytecode pip wrote at install either way. Writing it (into the gitignored __pycache__/ of
    # this checkout) took the fast loop from 135-141 to 107-117 user CPU-s (docs/BENCHMARKS.md).
    if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
        sys.dont_write_bytecode = False
    if not os.environ.get("PYTEST_XDIST_WORKER") and config.getvalue("dist") == "loadgroup":
        check_loadgroup_groups()
    # pytest's unraisable-exception check runs gc.collect() 5 times as each process ends: 1.7 CPU-s
    # in a collecting process, more in a worker that held Textual apps and MLflow stores; once
    # finds what a test left behind (pytest's own stash key; its pytester sets it the same way)
    from _pytest.unraisableexception import gc_collect_iterations_key

    config.stash[gc_collect_iterations_key] = 1
    # One ccache for every DeepSpeed JIT op build of the session (helpers.compiler_cache_env),
    # set by the controller before xdist starts its workers, so every process sees the same CXX.
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        from helpers import compiler_cache_env

        os.environ.update(compiler_cache_env(config._tmp_path_factory.getbasetemp()))  # noqa: SLF001 - pytest's own


def check_loadgroup_groups() -> None:
    """Refuse a pytest that pytest-xdist's ``--dist loadgroup`` cannot group with.

    xdist (3.8 and before) tells the controller a test's group by appending ``@group`` to its
    node id; pytest 9.2's structured node ids ignore that (pytest-dev/pytest-xdist#1386), and
    nothing fails: every group's tests are spread over all workers. Seen here: test_runner's
    launches, the bisect bench and the revision envs each built on two or three workers at once,
    and tests that build on each other's results ran apart. pyproject.toml pins pytest below 9.2.
    """
    from importlib.metadata import version

    from packaging.version import Version

    if Version(pytest.__version__).release >= (9, 2) and Version(version("pytest-xdist")).release <= (3, 8, 0):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} with pytest-xdist {version('pytest-xdist')}: --dist loadgroup would not group "
            "the tests (pytest-dev/pytest-xdist#1386); install what pyproject.toml pins (pytest<9.2)"
        )


def _group(item: pytest.Item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return None
    return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))


@pytest.hookimpl(tryfirst=True)  # before -m deselects, and before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_DIR in Path(item.path).parents:
            item.add_marker(pytest.mark.e2e)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker sorts alike: xdist compares them
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(_group(item) or "", len(rank)))  # stable: file order within


@pytest.hookimpl(optionalhook=True)  # without xdist (-p no:xdist) these two are never called
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN001, ANN201 - xdist's types
    """``--dist loadgroup``, with nothing long queued behind something long.

    A worker starts a test only once it holds the next one (xdist passes ``nextitem`` to the
    test protocol), so whatever it holds next waits for the test it runs. Stock loadgroup tops
    a worker up whenever it has two tests or fewer left; here only at one, and a worker on the
    last tests of a long group gets the queue's last unit (a short ungrouped test) rather than
    the next long group.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class LongestFirstScheduling(LoadGroupScheduling):
        def _reschedule(self, node) -> None:  # noqa: ANN001
            if self.workqueue and not node.shutting_down and self._pending_of(self.assigned_work[node]) > 1:
                return
            super()._reschedule(node)

        def _assign_work_unit(self, node) -> None:  # noqa: ANN001
            left = [scope for scope, tests in self.assigned_work.get(node, {}).items() if not all(tests.values())]
            if len(self.workqueue) > 1 and any(scope in LONGEST_FIRST for scope in left):
                self.workqueue.move_to_end(next(reversed(self.workqueue)), last=False)
            super()._assign_work_unit(node)

    return LongestFirstScheduling(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: :data:`WORKERS_PER_CORE` (full suite or fast loop); PYTEST_XDIST_AUTO_NUM_WORKERS wins."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    cores = len(os.sched_getaffinity(0))
    fast = "not e2e" in (config.option.markexpr or "")
    return max(1, min(MAX_WORKERS, round(cores * WORKERS_PER_CORE["fast" if fast else "full"])))


@pytest.fixture(scope="session")
def empty_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated, empty MLflow SQLite store; copying it saves seconds of migrations per test."""
    from helpers import shared_once

    def migrate(folder: Path) -> dict:
        from mlflow import MlflowClient

        MlflowClient(f"sqlite:///{folder / 'mlflow.db'}").search_experiments()
        return {"path": str(folder / "mlflow.db")}

    return Path(shared_once(tmp_path_factory, "empty-mlflow-db", migrate)["path"])


@pytest.fixture
def uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, empty_db: Path) -> str:
    """A store of its own for one test (a copy of the empty one), the process pointed at it, DSTUI_HOME in tmp_path."""
    shutil.copy(empty_db, tmp_path / "mlflow.db")
    u = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", u)
    monkeypatch.setenv("DSTUI_HOME", str(tmp_path))
    monkeypatch.setenv("DSTUI_GPU_LEDGER", str(tmp_path / "machine-ledger"))
    return u


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Path:
    """An isolated DSTUI_HOME with its own SQLite MLflow store.

    The store is a copy of ``empty_db``: MLflow's migrations cost a new store 1.5-2.5 CPU-seconds
    in every process that opens it first (supervisor, CLI, the test). A test marked
    ``no_store`` gets the folder without one (it checks that nothing creates it, say).
    """
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("DSTUI_HOME", str(h))
    monkeypatch.setenv("DSTUI_PRIVATE_DIR", str(tmp_path / "private"))  # real env values: outside the home
    monkeypatch.setenv("DSTUI_GPU_LEDGER", str(tmp_path / "machine-ledger"))  # cores and GPUs: this test's batches only
    monkeypatch.delenv("DSTUI_RUNS_DIR", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{h}/mlruns/mlflow.db")
    (h / "mlruns").mkdir()
    if request.node.get_closest_marker("no_store") is None:
        shutil.copy(request.getfixturevalue("empty_db"), h / "mlruns" / "mlflow.db")
    monkeypatch.chdir(h)
    return h


@pytest.fixture(scope="session")
def smoke_batch(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """``dstui run configs/experiments/smoke.yaml`` (4 runs of 2 gloo ranks, ZeRO 0-3), once for all workers.

    Its own DSTUI_HOME and MLflow store. Tests only read it: the run folders, the MLflow store,
    the CLI's output. Returns ``home``, ``uri`` (MLflow), ``returncode``, ``stdout``, ``stderr``.
    """
    import subprocess
    import sys

    from helpers import SPECS, shared_once

    def launch(home: Path) -> dict:
        (home / "mlruns").mkdir()
        uri = f"sqlite:///{home}/mlruns/mlflow.db"
        env = {k: v for k, v in os.environ.items() if k != "DSTUI_RUNS_DIR"}
        env.update(DSTUI_HOME=str(home), MLFLOW_TRACKING_URI=uri)
        proc = subprocess.run([sys.executable, "-m", "dstui", "run", str(SPECS / "smoke.yaml")], cwd=home, env=env,
                              capture_output=True, text=True, timeout=900)  # fmt: skip
        return {"home": str(home), "uri": uri, "returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}

    return shared_once(tmp_path_factory, "smoke-batch", launch)
