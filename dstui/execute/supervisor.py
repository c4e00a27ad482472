"""The batch supervisor: launches queued runs, follows them, feeds MLflow.

One supervisor per batch, in its own process session (``dstui supervise``),
holding ``supervisor.lock``. It does not depend on a terminal or on the TUI:
they only read the run folders. If it dies, the next ``dstui status`` or TUI
start takes over: runs keep going (they are in their own sessions), their exit
status is in ``exit.json`` (see :mod:`dstui.execute.wrap`), and ingestion resumes
from the byte offsets in each run's ``ingest.json``.

Exactly once: a point is sent, then its offset is saved. A crash between the
two re-sends points with the same (key, step, timestamp, value), which
MLflow's SQL store ignores, so history has every step once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from dstui.core import failures, phases
from dstui.core.errors import LockHeld
from dstui.core.records import (
    HEADER,
    STEP,
    SUMMARY,
    Follower,
    metric_values,
    parse_json_line,
    parse_seed_line,
)
from dstui.core.rundir import (
    ACTIVE_STATES,
    FINAL_STATES,
    BatchDir,
    RunDir,
    read_json,
    write_json_atomic,
)
from dstui.execute import gpu_share, launch, prebuild, slurm, sysmetrics
from dstui.execute.guard_watch import BatchGuard
from dstui.spec import dsconfig
from dstui.tracking import client as tracking

log = logging.getLogger("dstui.execute.supervisor")

MLFLOW_STATUS = {"done": "FINISHED", "failed": "FAILED", "killed": "KILLED", "skipped": "KILLED"}
KILL_GRACE_S = 5.0


# -- locking ----------------------------------------------------------------


class BatchLock:
    """flock on supervisor.lock: released by the kernel when the holder dies."""

    def __init__(self, batch: BatchDir) -> None:
        self.batch = batch
        self._fh: Any = None

    def acquire(self) -> None:
        self.batch.path.mkdir(parents=True, exist_ok=True)
        fh = open(self.batch.lock_file, "a+")  # noqa: SIM115 - held for the process lifetime
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise LockHeld(
                f"batch {self.batch.id} is already supervised by {holder}; "
                "use `dstui status` to watch it"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {os.uname().nodename}\n")
        fh.flush()
        self._fh = fh

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None


def is_supervised(batch: BatchDir) -> bool:
    """True when a live process holds the batch lock."""
    if not batch.lock_file.exists():
        return False
    with open(batch.lock_file, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


def spawn(batch: BatchDir, *, env: dict[str, str] | None = None, wait_s: float = 10.0) -> int:
    """Start a detached supervisor for a batch; returns its pid.

    Waits until it holds the batch lock (or has exited), so a caller that
    checks :func:`is_supervised` right after does not start a twin.
    """
    with open(batch.log_file, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dstui", "supervise", str(batch.path)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=env,
        )
    deadline = time.time() + wait_s
    while time.time() < deadline and proc.poll() is None and not is_supervised(batch):
        time.sleep(0.05)
    return proc.pid


def kick(batch: BatchDir, *, settle_s: float = 3.0) -> None:
    """Make sure queued runs of a batch get a supervisor.

    A live supervisor picks up newly queued runs by itself; one that is just
    finishing may already have looked. So: if the lock is free, or becomes free
    within ``settle_s``, start a new supervisor.
    """
    deadline = time.time() + settle_s
    while is_supervised(batch):
        if time.time() > deadline:
            return  # a supervisor in its main loop: it will see the queued run
        time.sleep(0.1)
    spawn(batch)


def ensure_supervised(batch: BatchDir) -> bool:
    """Take over an unfinished batch whose supervisor died. True if one was started."""
    if batch.is_finished() and batch.info().get("finalized"):
        return False
    if is_supervised(batch):
        return False
    spawn(batch)
    return True


# -- process helpers --------------------------------------------------------


def group_alive(pgid: int | None) -> bool:
    if not pgid:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie leader still "exists"; look for a live member
    for p in psutil.process_iter(["pid", "status"]):
        with contextlib.suppress(psutil.Error):
            if os.getpgid(p.info["pid"]) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                return True
    return False


def kill_group(pgid: int | None, grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM the run's whole process group, then SIGKILL what is left."""
    if not pgid:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.time() + grace_s
    while time.time() < deadline and group_alive(pgid):
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def request_cancel(rd: RunDir) -> None:
    """Ask the supervisor to cancel a run; also kill at once if we can (the TUI's key)."""
    rd.cancel_file.write_text(str(time.time()))
    if slurm.cancel_now(rd):  # a Slurm job: scancel; the supervisor settles it as cancelled
        return
    st = rd.status()
    if st.get("state") == "queued":
        if not is_supervised(rd.batch):  # else the supervisor sees the request before launching
            rd.update_status(state="killed", reason="cancelled before start", ended=time.time())
        return
    if st.get("state") in ACTIVE_STATES:
        kill_group(st.get("pgid"), grace_s=0.5)


# -- following one run ------------------------------------------------------


@dataclass
class Tracked:
    """Per-run ingestion state, mirrored to ingest.json."""

    rd: RunDir
    metrics: Follower
    system: Follower
    header_done: bool = False
    finalized: bool = False
    system_step: int = 0
    proc: subprocess.Popen | None = None
    tree: sysmetrics.ProcessTreeSampler | None = None
    last_sample: float = 0.0
    last_flush: float = 0.0
    pending: list[tuple[str, float, int, int]] = field(default_factory=list)

    def save(self) -> None:
        write_json_atomic(
            self.rd.ingest_file,
            {
                "metrics_offset": self.metrics.offset,
                "system_offset": self.system.offset,
                "bad_lines": self.metrics.bad_lines,
                "header_done": self.header_done,
                "finalized": self.finalized,
                "system_step": self.system_step,
            },
        )

    @classmethod
    def load(cls, rd: RunDir, fmt: str) -> Tracked:
        st = read_json(rd.ingest_file, {}) or {}
        source = rd.metrics_file if fmt == "jsonl" else rd.log_file
        t = cls(
            rd=rd,
            metrics=Follower(source, st.get("metrics_offset", 0), st.get("bad_lines", 0)),
            system=Follower(rd.system_file, st.get("system_offset", 0)),
            header_done=st.get("header_done", False),
            finalized=st.get("finalized", False),
            system_step=st.get("system_step", 0),
        )
        return t


class Supervisor:
    def __init__(
        self,
        batch: BatchDir,
        *,
        poll_s: float = 0.5,
        system_interval_s: float = 2.0,
        flush_interval_s: float = 2.0,
        tracking_uri: str | None = None,
    ) -> None:
        self.batch = batch
        self.poll_s = poll_s
        # Live runs send to MLflow at most this often: each send is a store transaction
        # (an fsync on SQLite), and fewer of them disturb a host-bound training loop less.
        self.flush_interval_s = flush_interval_s
        self.system_interval_s = system_interval_s
        self.info = batch.info()
        self.tracking_uri = tracking_uri or self.info.get("tracking_uri")
        self.parallel = max(gpu_share.AUTO, int(self.info.get("parallel", 1)))
        self.lock = BatchLock(batch)
        # executor hook: None = local processes (the default); Slurm jobs otherwise
        self.executor = slurm.SlurmExecutor(self.info) if self.info.get("executor") == "slurm" else None
        if self.executor is not None:
            self.parallel = self.executor.max_active
        self._jobs_known = True
        self.tracked: dict[str, Tracked] = {}
        self._client: Any = None
        self._mlflow_error: str | None = None
        self._mlflow_retry_at = 0.0
        self.experiment_id: str | None = None
        self.guards = BatchGuard(batch)

    # ---- MLflow, tolerant of an unreachable store ----

    def mlflow(self) -> Any:
        if self._client is None and time.time() >= self._mlflow_retry_at:
            try:
                c = tracking.client(self.tracking_uri)
                self.experiment_id = tracking.ensure_experiment(c, self.info["experiment"])
                self._client = c
                self._mlflow_error = None
            except Exception as e:
                self._tracking_down(e)
        return self._client

    def _tracking_down(self, e: Exception) -> None:
        msg = f"MLflow unreachable ({type(e).__name__}: {str(e)[:200]}); metrics stay on disk and are sent later"
        if msg != self._mlflow_error:
            log.warning(msg)
        self._mlflow_error = msg
        self._client = None
        self._mlflow_retry_at = time.time() + 5.0

    def parent_run_id(self) -> str | None:
        pid = self.info.get("mlflow_parent_run_id")
        if pid:
            return pid
        c = self.mlflow()
        if c is None:
            return None
        try:
            found = tracking.find_run(c, self.experiment_id, {"dstui.batch": self.batch.id, "dstui.role": "batch"})
            if found:
                pid = found.info.run_id
            else:
                tags = {
                    "dstui.role": "batch",
                    "dstui.batch": self.batch.id,
                    "dstui.spec": self.info.get("spec_path"),
                    "dstui.runs": len(self.info.get("runs", [])),
                    **tracking.host_tags(),
                }
                pid = tracking.create_run(c, self.experiment_id, self.batch.id, tags=tags)
            self.info = self.batch.update_info(mlflow_parent_run_id=pid)
            return pid
        except Exception as e:
            self._tracking_down(e)
            return None

    def child_run_id(self, rd: RunDir) -> str | None:
        st = rd.status()
        if st.get("mlflow_run_id"):
            return st["mlflow_run_id"]
        parent = self.parent_run_id()
        c = self.mlflow()
        if c is None or parent is None:
            return None
        try:
            spec = rd.spec()
            # the folder plus the attempt identifies this child, so a supervisor that died
            # between creating it and saving its id finds it again instead of making a twin
            ref = f"{rd.path}#{st.get('attempt', 1)}"
            found = tracking.find_run(c, self.experiment_id, {"dstui.run_dir": ref})
            if found:
                rid = found.info.run_id
            else:
                settings = spec.get("settings", {})
                tags = {
                    "dstui.role": "run",
                    "dstui.batch": self.batch.id,
                    "dstui.condition": spec.get("condition"),
                    "dstui.revision": spec.get("revision"),
                    "dstui.repeat": spec.get("repeat"),
                    "dstui.order": spec.get("order"),
                    "dstui.run_key": spec.get("key"),
                    "dstui.kind": settings.get("kind"),
                    "dstui.run_dir": ref,
                    "dstui.status": st.get("state"),
                    **tracking.host_tags(),
                }
                rev = spec.get("revision_info") or {}
                if rev:
                    from dstui.revisions.envs import ResolvedRevision

                    tags.update(ResolvedRevision.from_dict(rev).mlflow_tags())
                rid = tracking.create_run(c, self.experiment_id, rd.name, tags=tags, parent_id=parent)
                if rev.get("diff_path") and Path(rev["diff_path"]).is_file():
                    # a working-tree revision: the uncommitted changes it ran with
                    c.log_artifact(rid, rev["diff_path"], artifact_path="revision")
                params = _flat_settings(launch.redact(settings))
                params.update(dsconfig.flatten(read_json(rd.ds_config_file, {}) or {}))
                params["run_key"] = spec.get("key")
                params["revision"] = spec.get("revision")
                params["repeat"] = spec.get("repeat")
                tracking.log_params(c, rid, params)
            rd.update_status(mlflow_run_id=rid)
            return rid
        except Exception as e:
            self._tracking_down(e)
            return None

    # ---- main loop ----

    def run(self) -> int:
        self.lock.acquire()
        try:
            log.info("supervising batch %s (pid %d)", self.batch.id, os.getpid())
            self.parent_run_id()
            if self.executor is None:  # JIT ops built once, before any run's clock starts
                prebuild.before_first_run(self.batch, on_gpu=sysmetrics.gpu_count() > 0, log=log)
            while True:
                self.step()
                if self.done():
                    self.finalize_batch()
                    # a retry may have queued a run while we were finishing: look again
                    if not any(r.state == "queued" for r in self.batch.runs()):
                        return 0
                    self.batch.update_info(finalized=False)
                time.sleep(self.poll_s)
        finally:
            self.lock.release()

    def done(self) -> bool:
        runs = self.batch.runs()
        return all(r.state in FINAL_STATES for r in runs) and all(
            self._tracked(r).finalized for r in runs
        )

    def step(self) -> None:
        runs = self.batch.runs()
        if self.executor is not None:
            self._refresh_jobs(runs)
        for rd in runs:
            if not rd.path.exists():
                continue
            state = rd.state
            if self._live(rd.status()) or state in FINAL_STATES and not self._tracked(rd).finalized:
                self.follow(rd)
        active = [r for r in runs if self._live(r.status())]
        total_gpus = None
        for rd in runs:
            if rd.state == "queued" and not rd.status().get("job_id"):
                if rd.cancel_file.exists():
                    rd.update_status(state="killed", reason="cancelled before start", ended=time.time())
                    continue
                if self.executor is not None:  # Slurm places the job: only the count is ours
                    if len(active) >= self.parallel:
                        break
                    self.launch(rd, None)
                    active.append(rd)
                    continue
                if total_gpus is None:
                    total_gpus = sysmetrics.gpu_count()
                go, gpu_slice = gpu_share.choose(
                    rd.spec().get("settings") or {},
                    parallel=self.parallel,
                    active=len(active),
                    busy_slices=[b.status().get("gpu_slice") for b in active],
                    total_gpus=total_gpus,
                )
                if not go:
                    break  # runs start in their batch order
                self.launch(rd, gpu_slice)
                active.append(rd)

    def _tracked(self, rd: RunDir) -> Tracked:
        t = self.tracked.get(rd.name)
        if t is None:
            fmt = (rd.spec().get("settings") or {}).get("metrics_format", "jsonl")
            t = Tracked.load(rd, fmt)
            self.tracked[rd.name] = t
        return t

    def _live(self, st: dict) -> bool:
        """Started and not ended: a local process, or a submitted Slurm job (pending included)."""
        return st.get("state") in ("running", "starting") or self.executor is not None and slurm.has_job(st)

    def _refresh_jobs(self, runs: list[RunDir]) -> None:
        try:
            changed = self.executor.refresh(runs)  # type: ignore[union-attr]
            self._jobs_known = True
        except slurm.SlurmError as e:  # slurmctld busy or down: keep following files, judge no job
            log.warning("Slurm did not answer: %s", e)
            self._jobs_known = False
            return
        for rd in changed:  # Slurm's state and pending reason, visible in MLflow while it waits
            st = rd.status()
            self._tag(rd, {"dstui.status": st.get("state"), "dstui.reason": st.get("reason") or "",
                           "dstui.slurm_job": st.get("job_id"), "dstui.slurm_state": st.get("slurm_state"),
                           "dstui.nodes": st.get("nodes") or ""})  # fmt: skip

    def _tag(self, rd: RunDir, tags: dict[str, Any]) -> None:
        c = self.mlflow()
        rid = self.child_run_id(rd)
        if c is None or rid is None:
            return
        try:
            tracking.set_tags(c, rid, tags)
        except Exception as e:
            self._tracking_down(e)

    def launch(self, rd: RunDir, gpu_slice: list[int] | None) -> None:
        if self.executor is not None:
            self._submit(rd)
            return
        run = launch.load_runspec(rd)
        rev = rd.spec().get("revision_info") or {}
        rd.update_status(state="starting")
        self.child_run_id(rd)
        try:
            proc = launch.start(
                run,
                rd,
                python=rev.get("python"),
                gpu_slice=gpu_slice,
                # Bundled runners start in the run folder: `python -m` puts the cwd first on
                # sys.path, and a DeepSpeed clone there would shadow the revision's deepspeed.
                cwd=self.info.get("cwd") if run.settings.kind == "command" else None,
                revision=rev,
            )
        except OSError as e:
            rd.update_status(state="failed", reason=f"could not start: {e}", ended=time.time())
            return
        t = self._tracked(rd)
        t.proc = proc
        t.tree = sysmetrics.ProcessTreeSampler(proc.pid)
        log.info("started %s (pgid %d)", rd.name, proc.pid)

    def _submit(self, rd: RunDir) -> None:
        self.child_run_id(rd)
        try:
            self.executor.start(rd)  # type: ignore[union-attr]
        except (slurm.SlurmError, OSError) as e:
            rd.update_status(state="failed", reason=f"could not submit: {e}", ended=time.time())

    def follow(self, rd: RunDir) -> None:
        t = self._tracked(rd)
        st = rd.status()
        live = self._live(st)
        if live and self.executor is None:  # a Slurm job's processes are on its nodes
            self._sample_system(t, st)
        points = self._read_points(t, rd)
        t.pending.extend(points)
        self._guard(rd)
        if live:
            self._check_liveness(t, rd, st)
        self._flush(t, rd)
        if rd.state in FINAL_STATES and not t.finalized:
            self._finalize_run(t, rd)

    # ---- pieces of follow() ----

    def _sample_system(self, t: Tracked, st: dict) -> None:
        now = time.time()
        if now - t.last_sample < self.system_interval_s:
            return
        t.last_sample = now
        if t.tree is None and st.get("pid"):
            t.tree = sysmetrics.ProcessTreeSampler(st["pid"])
        rec = sysmetrics.sample(t.tree, st.get("gpu_slice"))
        with open(t.rd.system_file, "a") as fh:
            fh.write(json.dumps(rec) + "\n")

    def _read_points(self, t: Tracked, rd: RunDir) -> list[tuple[str, float, int, int]]:
        fmt = (rd.spec().get("settings") or {}).get("metrics_format", "jsonl")
        points: list[tuple[str, float, int, int]] = []
        last: dict[str, Any] = {}
        steps_done = None
        for line, _ in t.metrics.read_lines():
            if fmt == "seed":
                rec = parse_seed_line(line)
                if rec is None:
                    continue  # ordinary log output
                rec["time"] = None
            else:
                rec = parse_json_line(line)
                if rec is None:
                    if line.strip():
                        t.metrics.bad_lines += 1
                    continue
            ts = int((rec.get("time") or 0) * 1000) or _stable_ts(rd, rec)
            if rec["type"] == HEADER:
                self._on_header(t, rd, rec)
            elif rec["type"] == STEP:
                step = int(rec["step"])
                for key, value in metric_values(rec).items():
                    points.append((key, value, ts, step))
                steps_done = step
                self.guards.observe(rd, rec)
                last = {k: rec.get(k) for k in ("loss", "iter_time", "tokens_per_s", "mem_peak")}
            elif rec["type"] == SUMMARY:
                step = int(rec.get("steps") or 0)
                for key, value in metric_values(rec).items():
                    points.append((f"summary.{key}", value, ts, step))
                self._on_summary(t, rd, rec)
        for line, _ in t.system.read_lines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            node = rec.get("node", "node")
            ts = int(rec.get("time", 0) * 1000)
            for key, value in metric_values(rec).items():
                points.append((f"system/{node}/{key}", value, ts, t.system_step))
            t.system_step += 1
        if steps_done is not None:
            rd.update_status(steps_done=steps_done, last=last)
        return points

    def _on_header(self, t: Tracked, rd: RunDir, rec: dict) -> None:
        tags = tracking.versions_tags(rec)
        rd.update_status(header={k: rec.get(k) for k in ("device", "gpu_name", "gpu_count", "world_size", "hostname", "versions")})
        rev = rd.spec().get("revision_info") or {}
        if rev and (rd.spec().get("settings") or {}).get("kind") != "command":
            from dstui.revisions.envs import ResolvedRevision, check_reported_version

            mismatch = check_reported_version(ResolvedRevision.from_dict(rev), rec)
            if mismatch:
                log.error("%s: %s", rd.name, mismatch)
                rd.update_status(reason=f"revision mismatch: {mismatch}", revision_mismatch=True)
                kill_group(rd.status().get("pgid"), grace_s=1.0)
        c = self.mlflow()
        rid = self.child_run_id(rd)
        if c is not None and rid:
            try:
                tracking.set_tags(c, rid, tags)
                if not t.header_done:
                    # what the runner measured beats what dstui computed from settings
                    tracking.log_params(
                        c, rid, {k: rec.get(k) for k in ("tokens_per_step", "params", "flops_per_token", "peak_tflops", "world_size")}
                    )
                t.header_done = True
            except Exception as e:
                self._tracking_down(e)

    def _on_summary(self, t: Tracked, rd: RunDir, rec: dict) -> None:
        # a runner may add a second summary (e.g. a check's verdict): merge, don't replace
        merged = {**(rd.status().get("summary") or {}), **{k: v for k, v in rec.items() if k != "type"}}
        fields: dict[str, Any] = {"summary": merged}
        if rec.get("verdict"):
            fields["verdict"] = rec["verdict"]
        rd.update_status(**fields)

    def _guard(self, rd: RunDir) -> None:
        """Flag a NaN/diverged loss at its step (status.json, MLflow tag); end the run if stop_on says so."""
        flag = self.guards.check(rd)
        if flag is None:
            return
        log.warning("%s: %s", rd.name, flag.message)
        st = rd.update_status(diverged=flag.as_dict())
        stop = self.guards.guard(rd).should_stop and st.get("state") in ACTIVE_STATES
        if stop:
            rd.update_status(guard_stop=True)
            kill_group(st.get("pgid"), grace_s=1.0)
        c, rid = self.mlflow(), self.child_run_id(rd)
        if c is not None and rid:
            try:
                tracking.set_tags(c, rid, {"dstui.diverged": flag.message.removeprefix("diverged at ")})
            except Exception as e:
                self._tracking_down(e)

    def _check_liveness(self, t: Tracked, rd: RunDir, st: dict) -> None:
        if self.executor is not None:
            self._check_job(rd, st)
            return
        pgid = st.get("pgid")
        if rd.cancel_file.exists() and group_alive(pgid):
            kill_group(pgid)
        exit_info = read_json(rd.exit_file)
        ended = exit_info is not None
        if not ended:
            if t.proc is not None:
                ended = t.proc.poll() is not None
            else:
                ended = not group_alive(pgid)
        if not ended:
            if self._hung(rd, st):
                kill_group(pgid)
            return
        # the job is over: wait for the group to drain (ranks may outlive the leader)
        if group_alive(pgid):
            kill_group(pgid, grace_s=2.0)
        if t.proc is not None:
            with contextlib.suppress(Exception):
                t.proc.wait(timeout=5)
        exit_info = read_json(rd.exit_file) or {}
        self._settle(rd, exit_info)

    def _hung(self, rd: RunDir, st: dict) -> bool:
        """No new output for hung_after_s: marks the run hung (the caller kills it)."""
        hung_after = float((rd.spec().get("settings") or {}).get("hung_after_s", 600))
        last = max(
            (p.stat().st_mtime for p in (rd.log_file, rd.metrics_file) if p.exists()),
            default=st.get("started") or time.time(),
        )
        if time.time() - last <= hung_after:
            return False
        log.warning("%s: no output for %.0f s, killing it", rd.name, hung_after)
        rd.update_status(hung=True)
        return True

    def _check_job(self, rd: RunDir, st: dict) -> None:
        """A Slurm run: alive while Slurm says so; cancel and hang go through scancel."""
        ex = self.executor
        if ex is None or not self._jobs_known:
            return
        if ex.is_alive(rd):
            if rd.cancel_file.exists() and not st.get("cancel_sent"):
                rd.update_status(cancel_sent=True)
                ex.kill(rd)
            elif st.get("state") == "running" and st.get("started") and self._hung(rd, st):
                ex.kill(rd)
            return
        exit_info, verdict = ex.outcome(rd)
        if verdict and verdict.get("reason"):  # Slurm ended it (TIMEOUT, NODE_FAIL, ...)
            rd.update_status(**verdict, exit_code=exit_info.get("exit_code"), signal=exit_info.get("signal"), ended=time.time())
            log.info("%s ended: %s %s", rd.name, verdict["state"], verdict["reason"])
            return
        if verdict:
            rd.update_status(**verdict)
        self._settle(rd, exit_info)

    def _settle(self, rd: RunDir, exit_info: dict) -> None:
        st = rd.status()
        code = exit_info.get("exit_code")
        sig = exit_info.get("signal")
        summary = st.get("summary") or {}
        fields: dict[str, Any] = {"exit_code": code, "signal": sig, "ended": time.time()}
        if rd.cancel_file.exists():
            fields.update(state="killed", reason="cancelled")
        elif st.get("guard_stop"):
            fields.update(state="killed", reason=st["diverged"]["message"])
        elif st.get("hung"):
            hung_after = (rd.spec().get("settings") or {}).get("hung_after_s")
            fields.update(state="failed", reason=f"hung (no output for {hung_after:.0f} s); process group killed")
        elif st.get("revision_mismatch"):
            fields.update(state="failed")
        elif code == 0 and not st.get("steps_done") and not summary:
            fmt = (rd.spec().get("settings") or {}).get("metrics_format", "jsonl")
            expected = "metrics.jsonl records" if fmt == "jsonl" else "'Epoch .., Step .., Loss: ..' lines"
            fields.update(state="failed", reason=f"exited 0 but wrote no metrics (expected {expected})")
        elif code == 0:
            fields.update(state="done", reason=None)
        elif summary.get("verdict") == "FAIL":
            if summary.get("check"):
                fields.update(state="failed", reason=f"{summary['check']} FAIL")
            else:
                step = summary.get("first_diverging_step")
                fields.update(state="failed", reason=f"verify FAIL (first diverging step {step})")
        else:
            fields.update(state="failed", reason=failures.classify(rd.log_tail(16384), code, sig))
        rd.update_status(**fields)
        log.info("%s ended: %s %s", rd.name, fields["state"], fields.get("reason") or "")
        # killed or crashed ranks never unlink DeepSpeed's /dev/shm buffers: do it for them
        from dstui.core import shm

        removed = shm.remove_buffers(shm.master_port_of(st.get("argv")))
        if removed:
            log.info("%s: removed %d stale /dev/shm all-reduce buffers", rd.name, len(removed))

    def _flush(self, t: Tracked, rd: RunDir, *, force: bool = False) -> None:
        if not t.pending:
            t.save()
            return
        now = time.time()
        if not force and now - t.last_flush < self.flush_interval_s:
            return  # offsets stay unsaved with the points, so a crash re-reads them
        t.last_flush = now
        c = self.mlflow()
        rid = self.child_run_id(rd)
        if c is None or rid is None:
            return  # keep pending; offsets are not saved, so a restart re-reads them too
        try:
            tracking.log_metrics(c, rid, t.pending)
        except Exception as e:
            self._tracking_down(e)
            return
        t.pending = []
        t.save()

    def _finalize_run(self, t: Tracked, rd: RunDir) -> None:
        # drain whatever the job wrote last (reads are capped per call, so loop)
        while True:
            before = (t.metrics.offset, t.system.offset)
            t.pending.extend(self._read_points(t, rd))
            self._flush(t, rd, force=True)
            if t.pending:
                return  # MLflow is down: try again on the next pass
            if (t.metrics.offset, t.system.offset) == before:
                break
        c = self.mlflow()
        rid = self.child_run_id(rd)
        if c is None or rid is None:
            return
        st = _record_phases(rd)
        try:
            tags = {
                "dstui.status": st.get("state"),
                "dstui.reason": st.get("reason") or "",
                "dstui.exit_code": st.get("exit_code"),
                "dstui.bad_metric_lines": t.metrics.bad_lines,
            }
            if st.get("verdict"):
                tags["dstui.verdict"] = st["verdict"]
            if st.get("job_id"):
                tags.update({"dstui.slurm_job": st["job_id"], "dstui.slurm_state": st.get("slurm_state"), "dstui.nodes": st.get("nodes") or ""})
            if st.get("diverged"):  # again here: the live tag is lost if MLflow was down then
                tags["dstui.diverged"] = st["diverged"]["message"].removeprefix("diverged at ")
            tracking.set_tags(c, rid, tags)
            if st.get("phases"):  # time/launch, time/init, ... (dstui.core.phases)
                now_ms = int(time.time() * 1000)
                tracking.log_metrics(c, rid, [(f"time/{k}", v, now_ms, 0) for k, v in st["phases"].items() if v is not None])
            tracking.log_artifacts(c, rid, rd.path)
            tracking.finish(c, rid, MLFLOW_STATUS.get(st.get("state"), "FAILED"))
        except Exception as e:
            self._tracking_down(e)
            return
        t.finalized = True
        t.save()
        if st.get("requeue"):  # Slurm preempted it or lost a node: a fresh attempt, once by default
            from dstui.execute.batch import reset_run

            reset_run(rd)
            rd.update_status(requeues=int(st.get("requeues") or 0) + 1)
            self.tracked.pop(rd.name, None)
            log.info("%s: submitted again after %s", rd.name, st.get("slurm_state"))

    def finalize_batch(self) -> None:
        runs = self.batch.runs()
        states = [r.state for r in runs]
        c = self.mlflow()
        pid = self.parent_run_id()
        if c is not None and pid:
            with contextlib.suppress(Exception):
                tracking.set_tags(
                    c,
                    pid,
                    {f"dstui.runs_{s}": states.count(s) for s in FINAL_STATES},
                )
                tracking.log_file_artifact(c, pid, self.batch.batch_file)
                tracking.finish(c, pid, "FINISHED" if all(s in ("done", "skipped") for s in states) else "FAILED")
        self.batch.update_info(finalized=True, ended=time.time())
        log.info("batch %s finished: %s", self.batch.id, {s: states.count(s) for s in set(states)})


def _record_phases(rd: RunDir) -> dict[str, Any]:
    """Put the run's time breakdown (launch, init, compile, steps, teardown) into status.json."""
    times = phases.of_run(rd)
    if times is None:
        return rd.status()
    return rd.update_status(phases=times.as_dict())


def _flat_settings(settings: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in settings.items():
        if isinstance(v, dict):
            out.update(_flat_settings(v, f"{prefix}{k}."))
        elif isinstance(v, list):
            out[f"{prefix}{k}"] = json.dumps(v)
        else:
            out[f"{prefix}{k}"] = "" if v is None else str(v)
    return out


def _stable_ts(rd: RunDir, rec: dict) -> int:
    """A deterministic timestamp for records without one (seed-format lines).

    It must not change when the same line is re-read after a restart, or the
    store would keep both copies; the run's start time plus the step does that.
    """
    started = rd.status().get("started") or 0
    return int(started * 1000) + int(rec.get("step", 0))


def main(batch_path: str) -> int:
    # An unreachable tracking server must not stall following the runs: fail fast,
    # keep the metrics on disk, retry on a later pass.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout
    )
    batch = BatchDir(Path(batch_path).resolve())
    try:
        return Supervisor(batch).run()
    except LockHeld as e:
        print(f"dstui: {e}", file=sys.stderr)
        return 3
