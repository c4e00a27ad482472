"""Batches: validate a spec completely, then lay out its run folders.

Everything that can be wrong with a spec is found here, before a folder, a
process or an MLflow run exists: a bad spec leaves nothing behind.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dstui.core import names, paths, run_status, startup_trace
from dstui.core.errors import DstuiError, LockHeld, SpecError
from dstui.core.rundir import (
    FINAL_STATES,
    PRIVATE_SPEC_FILE,
    RETRIABLE_STATES,
    BatchDir,
    RunDir,
    list_batches,
    write_json_atomic,
)
from dstui.execute import backends, creation, guard_watch, launch, preflight
from dstui.execute.batch_lock import BatchLock
from dstui.spec import dsconfig
from dstui.spec.expand import expand
from dstui.spec.experiment import ExperimentSpec, RunSpec
from dstui.spec.loading import load_spec, naming_file, parse_spec

log = logging.getLogger("dstui.execute.batch")


@dataclass
class Plan:
    """A validated spec, ready to lay out: runs, their configs and revision envs."""

    spec_path: Path
    spec: ExperimentSpec
    runs: list[RunSpec]
    ds_configs: dict[str, dict]
    revisions: dict[str, dict[str, Any]]


def plan(
    spec_path: str | Path,
    *,
    validate: bool = True,
    resolve_revisions: bool = True,
    progress: Callable[[str], None] = print,
    only: list[str] | None = None,
    executor: str | None = None,
    slurm: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
) -> Plan:
    """A validated spec; ``executor`` and ``slurm`` (set fields only) override the spec's (CLI flags).

    ``data``: the spec as edited in Compose and not saved; ``spec_path`` then only names it and
    places relative ds_config paths.
    """
    spec_path = Path(spec_path).resolve()
    file = str(spec_path)
    spec = load_spec(spec_path) if data is None else parse_spec(data, file=file)
    if executor or slurm:
        spec = with_executor(spec, executor, slurm or {}, file=file)
    runs = expand(spec, file=file)
    guard_watch.check_spec(spec, runs, file=file)
    if only:
        runs = select(runs, only, file=file)
    startup_trace.mark("spec_expanded", "cli")
    if validate:
        preflight.check_models(runs, file=file)
        startup_trace.mark("models_checked", "cli")
        configs = dsconfig.build_and_validate(runs, file=file, spec_dir=spec_path.parent)
    else:
        configs = {r.name: dsconfig.build(r, spec_dir=spec_path.parent, file=file) for r in runs}
    revisions: dict[str, dict[str, Any]] = {}
    if spec.revisions and resolve_revisions:
        from dstui.revisions import envs as rev_mod

        with naming_file(file):  # an unknown git ref, a missing folder: said with the spec's file, as at load
            resolved = rev_mod.resolve_all(spec.revisions, progress=progress)
        revisions = {name: _as_dict(r) for name, r in resolved.items()}
    return Plan(spec_path, spec, runs, configs, revisions)


def with_executor(spec: ExperimentSpec, executor: str | None, slurm: dict[str, Any], *, file: str) -> ExperimentSpec:
    """The spec with command-line executor options laid over its own, validated again."""
    data = spec.model_dump(mode="json")
    if executor:
        data["executor"] = executor
    data["slurm"] = {**data.get("slurm", {}), **{k: v for k, v in slurm.items() if v is not None}}
    return parse_spec(data, file=file)


def select(runs: list[RunSpec], patterns: list[str], *, file: str | None = None) -> list[RunSpec]:
    """The runs whose name or condition matches any of the shell-style patterns (order kept)."""
    chosen = [r for r in runs if any(fnmatch.fnmatchcase(r.name, p) or fnmatch.fnmatchcase(r.condition, p) for p in patterns)]
    if not chosen:
        names = ", ".join(sorted({r.condition for r in runs}))
        raise SpecError(f"no run matches {' '.join(patterns)!r}; its conditions: {names}", file=file, field="--only")
    return chosen


def _as_dict(obj: Any) -> dict[str, Any]:
    from dataclasses import asdict, is_dataclass

    return asdict(obj) if is_dataclass(obj) else dict(obj)


def create(p: Plan, *, runs_root: Path | None = None, parallel: int = 0, tracking_uri: str | None = None) -> BatchDir:
    """A new batch, whole (see :mod:`dstui.execute.creation`)."""
    return creation.create(p, runs_root=runs_root, parallel=parallel, tracking_uri=tracking_uri)


def latest_batch_for(experiment: str, runs_root: Path | None = None) -> BatchDir | None:
    for b in list_batches(runs_root or paths.runs_dir()):
        if b.info().get("experiment") == experiment:
            return b
    return None


def reset_run(rd: RunDir, *, gone: str | None = None) -> None:
    """Queue a run again, keeping the previous attempt's files under attempts/N/.

    The previous attempt's MLflow run is listed for the supervisor to end
    (:meth:`dstui.execute.mlflow_runs.MlflowRuns.close_earlier`) if it is still
    RUNNING: this needs no MLflow, and a store that is down now is not a reason to
    leave it open. ``gone``: the attempt had not ended (its job and supervisor
    died); it is recorded as failed with this reason.
    """
    from dstui.execute.mlflow_runs import EARLIER_ATTEMPTS, earlier_attempt

    n, keep = attempt_folder(rd)
    with os.scandir(rd.path) as entries:
        moving = [e.name for e in entries if not e.is_dir(follow_symlinks=False)]
    for name in moving:
        if name not in ("spec.json", "ds_config.json", PRIVATE_SPEC_FILE):  # the last: older folders
            # a rename of the entry itself: a link the job left moves as a link, its target untouched
            os.rename(rd.path / name, keep / name)
    kept = RunDir(keep)
    old = kept.status()
    if old.get("state") not in FINAL_STATES:
        old = dict(run_status.ended(kept, run_status.FAILED, gone or "ended unrecorded").raw)
    earlier = [*(old.get(EARLIER_ATTEMPTS) or []), earlier_attempt(rd, old)]
    run_status.requeued(
        rd,
        attempt=n + 1,
        **{k: old.get(k) for k in ("name", "condition", "revision", "repeat", "key", "order", "steps_total")},
        **{EARLIER_ATTEMPTS: earlier},
    )


def attempt_folder(rd: RunDir) -> tuple[int, Path]:
    """(N, ``attempts/N``) for the attempt being put aside: a new real folder inside the run's own.

    The run folder is the job's too: ``attempts`` may be a link the job planted (retry moved the
    run's files through it, out of the home), a file, a FIFO. Nothing is ever moved or created
    through a link: a run folder that is not a real folder inside its batch is refused, and an
    ``attempts`` that is not a real folder is moved aside (as the entry it is) into the new attempt.
    """
    batch = rd.path.parent
    if rd.path.is_symlink() or not rd.path.is_dir() or rd.path.resolve().parent != batch.resolve():
        raise DstuiError(f"refusing to re-queue {rd.path}: not a real run folder inside batch {batch}")
    attempts = rd.path / "attempts"
    stray = None
    if os.path.lexists(attempts) and not (attempts.is_dir() and not attempts.is_symlink()):
        stray = rd.path / f".attempts-not-a-folder-{os.getpid()}"
        os.rename(attempts, stray)
    attempts.mkdir(exist_ok=True)
    with os.scandir(attempts) as entries:
        numbers = [int(e.name) for e in entries if e.name.isdigit() and len(e.name) < 10]
    n = max(numbers, default=0) + 1
    keep = attempts / str(n)
    keep.mkdir()
    if stray is not None:
        os.rename(stray, keep / "attempts")
        log.warning("%s: 'attempts' was not a folder of its own; kept, unfollowed, as %s", rd.name, keep / "attempts")
    return n, keep


def resume(
    p: Plan,
    *,
    runs_root: Path | None = None,
    parallel: int = 0,
    tracking_uri: str | None = None,
    partial: bool = False,
    batch_ref: str | None = None,
) -> tuple[BatchDir, dict[str, int]]:
    """Re-use a batch of this spec (``batch_ref``, else the newest): keep done runs with the same key, re-queue the rest.

    ``partial``: the plan holds only some of the spec's runs (``--only``); the
    batch keeps its other runs as they are instead of dropping them. A batch whose
    creation was cut short is completed here (its missing runs are laid out).
    """
    root = runs_root or paths.runs_dir()
    if batch_ref:
        batch = creation.find_batch(batch_ref, root)
        if batch is None:
            raise DstuiError(f"no batch {batch_ref!r} under {root}; `dstui status` lists them")
        exp = batch.info().get("experiment")
        if exp != p.spec.name:
            raise DstuiError(f"batch {batch.id} holds experiment {exp!r}, not {p.spec.name!r} of {p.spec_path}")
    else:
        batch = latest_batch_for(p.spec.name, root)
    if batch is None:
        return create(p, runs_root=runs_root, parallel=parallel, tracking_uri=tracking_uri), {"new": len(p.runs)}
    lock = BatchLock(batch)
    try:
        lock.acquire()  # no supervisor may start on it (or finish it) while its runs are re-laid
    except LockHeld:
        raise DstuiError(f"batch {batch.id} is still being supervised; watch it with `dstui status`") from None
    try:
        return batch, _resume_locked(batch, p, parallel, partial)
    finally:
        lock.release()


def _resume_locked(batch: BatchDir, p: Plan, parallel: int, partial: bool) -> dict[str, int]:
    counts = {"kept": 0, "requeued": 0, "new": 0}
    info = batch.info()
    run_names = [r.name for r in p.runs]
    if partial:  # the batch's order stays; runs new to it go last
        old = list(info.get("runs", []))
        run_names = old + [n for n in run_names if n not in old]
    # a resume cut short is settled like a creation: every run it was to lay out is named first
    batch.update_info(runs=run_names, **{creation.COMPLETE: False})
    for run in p.runs:
        rd = RunDir(names.child_path(batch.path, run.name))
        st = rd.status()
        if st.get("key") == run.key and st.get("state") == "done":
            counts["kept"] += 1
            continue
        if rd.path.exists() and st.get("key") == run.key and st.get("state") in FINAL_STATES:
            reset_run(rd)
            counts["requeued"] += 1
        elif rd.path.exists() and st.get("key") == run.key and st.get("state") in ("starting", "running"):
            # its supervisor died (resume refuses supervised batches): a job that is gone
            # crashed with it and runs again; one still running is followed by the next supervisor
            if backends.for_run(rd, st).alive(st):
                counts["kept"] += 1
            else:
                reset_run(rd, gone="its job was gone when the batch was resumed (supervisor and job died)")
                counts["requeued"] += 1
        elif st.get("key") != run.key or not rd.path.exists():
            if rd.path.exists():
                _remove_run_folder(batch, rd)
            counts["new"] += 1
        launch.prepare(batch.path, run, p.ds_configs[run.name], revision=p.revisions.get(run.revision))
    info.update(runs=run_names, parallel=parallel, finalized=False, resumed=time.time(), **creation.executor_info(p),
                **{creation.COMPLETE: False, creation.PROBLEM: None})  # fmt: skip
    write_json_atomic(batch.batch_file, info)
    creation.settle(batch, locked=True)  # runs --only left out and never laid out: failed, with the reason
    return counts


def _remove_run_folder(batch: BatchDir, rd: RunDir) -> None:
    """Delete a stale run folder; only ever a real folder directly inside this batch."""
    if rd.path.is_symlink() or not names.inside(batch.path, rd.path) or rd.path.resolve().parent != batch.path.resolve():
        raise DstuiError(f"refusing to delete {rd.path}: not a run folder inside batch {batch.path}")
    shutil.rmtree(rd.path)


def retry(rd: RunDir, *, force: bool = False) -> None:
    """Queue a finished run again (its attempt kept); who supervises it is the caller's
    (:func:`dstui.usecases.control.requeue`: the takeover rule, once per batch).

    A done run is refused unless ``force``: queuing a good measurement again by
    a slip of the finger would cost a run's time, and its result is replaced
    in reports by the new attempt's (:func:`dstui.analysis.fetch.newest_attempts`).
    """
    if rd.state not in FINAL_STATES:
        raise DstuiError(f"run {rd.name} is {rd.state}; only finished runs can be retried")
    if rd.state not in RETRIABLE_STATES and not force:
        raise DstuiError(
            f"run {rd.name} is {rd.state}; retry queues failed, killed or skipped runs "
            "(--force runs a done one again: reports then count its new attempt, not both)"
        )
    if not rd.spec_file.exists():  # settled after a cut-short creation (dstui.execute.creation)
        spec = rd.batch.info().get("spec_path") or "SPEC"
        raise DstuiError(f"run {rd.name} was never created; `dstui run {spec} --resume {rd.batch.id}` creates it")
    reset_run(rd)
    rd.batch.update_info(finalized=False)
