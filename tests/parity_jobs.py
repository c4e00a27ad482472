"""Parity-runner jobs for the e2e tests: two gloo ranks of runners/compare_loss.py, launched together.

A test module declares ``CASES`` (name -> argv) and optional ``RECIPES`` (name -> (ds_config,
$DSTUI_PARITY_INJECT)); :func:`jobs_fixture` makes its module-scoped fixture, which starts every case
the selected tests use at once, MAX_PARALLEL running (each job holds ~2 GB of RSS); a test waits for its
own with :func:`finished`. Non-parametrized tests declare what they read with :func:`uses`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from dstui.execute.launch import free_port

REPO = Path(__file__).resolve().parents[1]
RUNNER = REPO / "runners" / "compare_loss.py"
MAX_PARALLEL = 2
LAUNCH_TIMEOUT_S = 540

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Job:
    name: str
    argv: list[str]
    metrics: Path
    log: Path
    done: threading.Event = field(default_factory=threading.Event)
    returncode: int | None = None
    seconds: float = 0.0
    env: dict[str, str] = field(default_factory=dict)

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def records(self, kind: str) -> list[dict]:
        if not self.metrics.exists():
            return []
        recs = [json.loads(line) for line in self.metrics.read_text().splitlines() if line.strip()]
        return [r for r in recs if r["type"] == kind]

    def summary(self) -> dict:
        found = self.records("summary")
        assert found, f"{self.name}: no summary record (exit {self.returncode})\n{self.output[-4000:]}"
        return found[-1]


def uses(*names: str) -> Callable[[F], F]:
    """Declare the jobs a non-parametrized test reads, so that only those are launched."""

    def mark(fn: F) -> F:
        fn.cases = names  # type: ignore[attr-defined]
        return fn

    return mark


def _run(job: Job, slots: threading.Semaphore) -> None:
    with slots:
        start = time.monotonic()
        # dstui's rank starter, what `dstui run` uses on one node (test_ranks_env.py: the ranks get
        # what DeepSpeed's launcher gives them); the launcher would import DeepSpeed twice per job
        cmd = [sys.executable, "-m", "dstui.execute.injob.ranks", "--nproc", "2",
               "--master-port", str(free_port()), "--", sys.executable, str(RUNNER), *job.argv,
               "--metrics-file", str(job.metrics)]
        env = {k: v for k, v in os.environ.items() if k not in ("DSTUI_METRICS_FILE", "DSTUI_PARITY_INJECT")}
        env.update(job.env)
        with open(job.log, "w") as log:
            try:
                job.returncode = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                                env=env, timeout=LAUNCH_TIMEOUT_S).returncode
            except subprocess.TimeoutExpired:
                job.returncode = -1
        job.seconds = time.monotonic() - start
        job.done.set()


def _wanted(session: pytest.Session, cases: dict[str, list[str]], module: Any) -> list[str]:
    """The cases that the selected tests use (so ``-k inject`` launches two jobs, not six)."""
    names = []
    for item in session.items:
        if item.module is not module:
            continue
        callspec = getattr(item, "callspec", None)
        case = callspec.params.get("case") if callspec else None
        for name in ([case] if case else []) + list(getattr(item.function, "cases", ())):
            if name in cases and name not in names:
                names.append(name)
    return names


def jobs_fixture(cases: dict[str, list[str]], recipes: dict[str, tuple[dict, str | None]] | None = None) -> Any:
    """The module-scoped ``jobs`` fixture of a test module with these cases (see the module docstring)."""

    @pytest.fixture(scope="module")
    def jobs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Job]:
        base = tmp_path_factory.mktemp("compare_loss")
        slots = threading.Semaphore(MAX_PARALLEL)
        out: dict[str, Job] = {}
        for name in _wanted(request.session, cases, request.module):
            job = Job(name, cases[name], base / f"{name}.jsonl", base / f"{name}.log")
            if name in (recipes or {}):
                cfg, fault = (recipes or {})[name]
                (base / f"{name}.json").write_text(json.dumps(cfg))
                job.argv = [*job.argv, "--ds-config", str(base / f"{name}.json")]
                job.env = {"DSTUI_PARITY_INJECT": fault} if fault else {}
            out[name] = job
            threading.Thread(target=_run, args=(job, slots), daemon=True).start()
        return out

    return jobs


def finished(jobs: dict[str, Job], name: str) -> Job:
    job = jobs[name]
    assert job.done.wait(LAUNCH_TIMEOUT_S * len(jobs)), f"{name} never finished"
    return job
