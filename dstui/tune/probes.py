"""Probes through the launch path: the ONE module of the tuner that launches, follows and stops runs.

A probe is a run of the search's batch, like any other: a run folder, the
batch's detached supervisor, its MLflow child under the batch's parent. The
first probe creates the batch (``execute.batch.create``); each later one adds
its run to it (``execute.batch.resume`` with ``partial``: the batch keeps its
earlier probes as they are), then a supervisor is spawned. Probes run one at a
time, so their step times do not disturb each other.

This is today's launch path. When the launch service (``dstui/usecases/launch.py``,
issue 39) lands, :class:`ProbeLauncher` calls it instead; nothing else in
:mod:`dstui.tune` launches or follows a process.

Following a probe: its step times are read from its metrics file as they come;
when the caller's rule says it has measured enough, ``stop.request`` asks the
runner to end after the current step (it ends ``done``, with its summary). The
time box is the run's own ``max_runtime_s`` (the supervisor kills it past
that), and this module cancels it as well should the supervisor not (a grace of
:data:`BOX_GRACE_S`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dstui.core import paths, run_status
from dstui.core.errors import DstuiError
from dstui.core.record_file import read_records
from dstui.core.run_status import RunStatus
from dstui.core.rundir import FINAL_STATES, BatchDir, RunDir
from dstui.execute import batch as batch_mod
from dstui.execute import control
from dstui.execute.batch_lock import is_supervised
from dstui.usecases.takeover import Takeover

BOX_GRACE_S = 10.0  # past its time box + this, the tuner cancels a probe the supervisor has not stopped
FINALIZE_WAIT_S = 90.0  # after a probe ends: how long its supervisor may take to hand MLflow the rest
UNSUPERVISED_WAIT_S = 120.0  # before adding a probe: how long the previous supervisor may take to exit


@dataclass
class ProbeRun:
    """What a probe's run left: its end, its step times in order, and its MLflow child."""

    state: str
    reason: str | None = None
    started: float | None = None
    ended: float | None = None
    times: list[float] = field(default_factory=list)
    tokens_per_s: list[float] = field(default_factory=list)
    mem_peak: float | None = None
    mlflow_run_id: str | None = None
    stop_asked: str | None = None  # why the tuner asked it to stop
    cancelled_at_box: bool = False


def _step_series(rd: RunDir) -> tuple[list[float], list[float], float | None]:
    steps = [r for r in read_records(rd.metrics_file) if r.get("type") == "step" and isinstance(r.get("step"), int)]
    steps.sort(key=lambda r: r["step"])
    times = [float(r["iter_time"]) for r in steps if isinstance(r.get("iter_time"), (int, float))]
    rates = [float(r["tokens_per_s"]) for r in steps if isinstance(r.get("tokens_per_s"), (int, float))]
    peaks = [float(r["mem_peak"]) for r in steps if isinstance(r.get("mem_peak"), (int, float))]
    return times, rates, max(peaks) if peaks else None


class ProbeLauncher:
    """Launches the candidates of one planned space as the runs of one batch."""

    def __init__(self, plan: batch_mod.Plan, *, runs_root: Path | None = None, poll_s: float = 0.5) -> None:
        self.plan = plan
        self.runs_root = runs_root or paths.runs_dir()
        self.poll_s = poll_s
        self._runs = {r.condition: r for r in plan.runs}
        self.takeover = Takeover()

    def run_name(self, condition: str) -> str:
        return self._runs[condition].name

    def batch(self, batch_id: str) -> BatchDir:
        return BatchDir(self.runs_root / batch_id)

    def folder(self, batch_id: str, condition: str) -> RunDir:
        return RunDir(self.batch(batch_id).path / self.run_name(condition))

    def laid_out(self, batch_id: str | None, condition: str) -> bool:
        """The probe's run exists in the batch (it was launched before a restart)."""
        return bool(batch_id) and self.folder(batch_id, condition).status_file.exists()

    def start(self, batch_id: str | None, condition: str, *, on_batch: Callable[[str], None] | None = None) -> str:
        """Lay out the candidate's run (a new batch, or one more run of the search's) and supervise it.

        ``on_batch`` hears a new batch's id before its supervisor starts (the caller saves it first).
        """
        plan = dataclasses.replace(self.plan, runs=[self._runs[condition]])
        if batch_id is None or not self.batch(batch_id).batch_file.exists():
            b = batch_mod.create(plan, runs_root=self.runs_root, parallel=1)
            if on_batch is not None:
                on_batch(b.id)
        else:
            self._wait_unsupervised(self.batch(batch_id))
            b, _ = batch_mod.resume(plan, runs_root=self.runs_root, parallel=1, partial=True, batch_ref=batch_id)
        control.spawn(b)
        return b.id

    def _wait_unsupervised(self, b: BatchDir) -> None:
        deadline = time.monotonic() + UNSUPERVISED_WAIT_S
        while is_supervised(b):
            if time.monotonic() > deadline:
                raise DstuiError(f"batch {b.id} is still supervised after {UNSUPERVISED_WAIT_S:.0f} s; see {b.log_file}")
            time.sleep(self.poll_s)

    def follow(
        self,
        batch_id: str,
        condition: str,
        *,
        box_s: float,
        enough: Callable[[list[float]], str | None],
        on_step: Callable[[ProbeRun], None] | None = None,
    ) -> ProbeRun:
        """Follow the probe to its end; ask it to stop once ``enough(step times)`` gives a reason."""
        b, rd = self.batch(batch_id), self.folder(batch_id, condition)
        out = ProbeRun(state="queued")
        seen = -1
        while True:
            st = RunStatus.of(rd)
            out.state, out.reason, out.started = st.get("state", "queued"), st.reason, st.started
            out.times, out.tokens_per_s, out.mem_peak = _step_series(rd)
            if len(out.times) != seen:
                seen = len(out.times)
                if on_step is not None:
                    on_step(out)
            if out.state in FINAL_STATES:
                break
            self._steer(rd, st, out, box_s, enough)
            self.takeover.look_one(b)  # taken over by the one rule if its supervisor died
            time.sleep(self.poll_s)
        self._wait_finalized(b)
        st = RunStatus.of(rd)
        out.ended, out.mlflow_run_id = st.ended, st.mlflow_run_id
        out.times, out.tokens_per_s, out.mem_peak = _step_series(rd)
        return out

    def _steer(self, rd: RunDir, st: RunStatus, out: ProbeRun, box_s: float, enough: Callable[[list[float]], str | None]) -> None:
        """Ask for a stop once measured; cancel past the box should the supervisor not have."""
        if out.stop_asked is None and st.state == run_status.RUNNING:
            why = enough(out.times)
            if why:
                out.stop_asked = why
                rd.stop_file.write_text(why)
        if st.started and not out.cancelled_at_box and time.time() - st.started > box_s + BOX_GRACE_S:
            out.cancelled_at_box = True
            control.request_cancel(rd)

    def _wait_finalized(self, b: BatchDir) -> None:
        deadline = time.monotonic() + FINALIZE_WAIT_S
        while not b.info().get("finalized") and is_supervised(b) and time.monotonic() < deadline:
            time.sleep(self.poll_s)

    def parent_run_id(self, batch_id: str) -> str | None:
        return self.batch(batch_id).info().get("mlflow_parent_run_id")
