"""Parity-runner jobs for the e2e tests: cases of runners/compare_loss.py on two gloo ranks, a few launches.

A test module declares ``CASES`` (name -> argv) and optional ``RECIPES`` (name -> (ds_config,
$DSTUI_PARITY_INJECT)); :func:`jobs_fixture` makes its module-scoped fixture, which starts every case
the selected tests use; a test waits for its own with :func:`finished`. Non-parametrized tests declare
what they read with :func:`uses`.

The cases share launches (``compare_loss.py --cases``, runners/parity_cases.py): starting two ranks
costs ~12 CPU-s and a case of these tiny models ~3, so one launch per case spent most of the module
starting ranks. Each case still gets its own argv, environment, metrics file, log and exit code, as a
launch of its own would; ``test_compare_loss.py::test_a_case_run_beside_others_gives_the_bits_it_gives_alone``
holds the runner to that. At most MAX_PARALLEL launches run at once (each holds ~2 GB of RSS), a
launch runs at most CASES_PER_LAUNCH cases, and pipeline cases get launches of their own (DeepSpeed
keeps the topology in module globals).
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
CASES_PER_LAUNCH = 7
CASE_TIMEOUT_S = 300

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Job:
    name: str
    argv: list[str]
    metrics: Path
    log: Path
    done: threading.Event = field(default_factory=threading.Event)
    returncode: int | None = None
    alone: bool = False  # a launch of its own, without --cases (what the shared launches are held to)
    position: int = 0  # how many cases its launch ran before it
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


def _launch(group: list[Job], base: Path, slots: threading.Semaphore) -> None:
    """One launch running ``group``'s cases in order; each job is done as soon as its exit file is there."""
    with slots:
        for position, job in enumerate(group):
            job.position = position
        runner, extra_env, launch_log = _how(group, base)
        # dstui's rank starter, what `dstui run` uses on one node (test_ranks_env.py: the ranks get
        # what DeepSpeed's launcher gives them); the launcher would import DeepSpeed twice per job
        cmd = [sys.executable, "-m", "dstui.execute.injob.ranks", "--nproc", "2",
               "--master-port", str(free_port()), "--", sys.executable, str(RUNNER), *runner]
        env = {k: v for k, v in os.environ.items() if k not in ("DSTUI_METRICS_FILE", "DSTUI_PARITY_INJECT")}
        with open(launch_log, "w") as log:
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**env, **extra_env})
            deadline = time.monotonic() + CASE_TIMEOUT_S * len(group)
            while True:
                ended = _wait(proc, deadline)
                for job in group:
                    if not job.done.is_set() and _exit_file(job).exists():
                        job.returncode = int(_exit_file(job).read_text())
                        job.done.set()
                if ended:
                    break
        if group[0].alone:  # its exit code is the launch's
            group[0].returncode = proc.returncode
            group[0].done.set()
        for job in group:  # the launch ended before these cases ran: their logs say how it ended
            if not job.done.is_set():
                with open(job.log, "a") as out:
                    out.write(f"\n[launch of {[j.name for j in group]} ended with {proc.returncode} before "
                              f"this case finished]\n{launch_log.read_text(errors='replace')[-4000:]}")
                job.returncode = -1
                job.done.set()


def _how(group: list[Job], base: Path) -> tuple[list[str], dict[str, str], Path]:
    """The runner's arguments, the environment a launch adds, and the launch's own log."""
    first = group[0]
    if first.alone:  # a launch of its own, as before --cases: its argv, its environment, its log
        return [*first.argv, "--metrics-file", str(first.metrics)], first.env, first.log
    cases = base / f"launch-{first.name}.json"
    cases.write_text(json.dumps([{"argv": [*job.argv, "--metrics-file", str(job.metrics)], "env": job.env,
                                  "log": str(job.log), "exit_file": str(_exit_file(job))} for job in group]))
    return ["--cases", str(cases)], {}, base / f"launch-{first.name}.log"


def _exit_file(job: Job) -> Path:
    return job.log.with_suffix(".exit")


def _wait(proc: subprocess.Popen, deadline: float) -> bool:
    """Whether the launch ended (killed at ``deadline``), after at most a second of waiting."""
    try:
        proc.wait(timeout=1.0)
        return True
    except subprocess.TimeoutExpired:
        if time.monotonic() < deadline:
            return False
        proc.kill()
        proc.wait()
        return True


def _launches(jobs: list[Job]) -> list[list[Job]]:
    """Jobs of one pipeline topology together, split into launches of at most CASES_PER_LAUNCH, in order."""
    families: dict[str, list[Job]] = {}
    out = [[job] for job in jobs if job.alone]
    for job in (j for j in jobs if not j.alone):
        stages = job.argv[job.argv.index("--pipeline-stages") + 1] if "--pipeline-stages" in job.argv else "1"
        families.setdefault(stages, []).append(job)
    for family in families.values():
        n = -(-len(family) // CASES_PER_LAUNCH)
        out += [family[i::n] for i in range(n)]
    return out


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


def jobs_fixture(cases: dict[str, list[str]], recipes: dict[str, tuple[dict, str | None]] | None = None,
                 alone: tuple[str, ...] = ()) -> Any:
    """The module-scoped ``jobs`` fixture of a test module with these cases (see the module docstring).

    The cases named in ``alone`` get a launch each, without ``--cases``.
    """

    @pytest.fixture(scope="module")
    def jobs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Job]:
        base = tmp_path_factory.mktemp("compare_loss")
        out: dict[str, Job] = {}
        for name in _wanted(request.session, cases, request.module):
            job = Job(name, cases[name], base / f"{name}.jsonl", base / f"{name}.log", alone=name in alone)
            if name in (recipes or {}):
                cfg, fault = (recipes or {})[name]
                (base / f"{name}.json").write_text(json.dumps(cfg))
                job.argv = [*job.argv, "--ds-config", str(base / f"{name}.json")]
                job.env = {"DSTUI_PARITY_INJECT": fault} if fault else {}
            out[name] = job
        slots = threading.Semaphore(MAX_PARALLEL)
        for group in _launches(list(out.values())):
            threading.Thread(target=_launch, args=(group, base, slots), daemon=True).start()
        return out

    return jobs


def finished(jobs: dict[str, Job], name: str) -> Job:
    job = jobs[name]
    assert job.done.wait(CASE_TIMEOUT_S * (len(jobs) + 1)), f"{name} never finished"
    return job
