"""A batch exists whole or not at all: laid out under a lock, marked complete last, settled when cut short.

``dstui run`` can be killed (kill -9, a lost session, a reboot) while it lays out
a batch's run folders. Without care that left a ``batch.json`` naming runs whose
folders never came, a batch no one finalized and a supervisor waiting forever.
So:

1. the batch is prepared in a hidden folder (``.creating-*``, which no reader
   lists) holding its ``supervisor.lock`` and a ``batch.json`` with
   ``"complete": false``, then renamed to its id: the rename is the claim, and the
   batch appears at once with its info and its lock held;
2. the run folders are laid out (each one's ``status.json`` written last);
3. ``"complete": true`` is written last, and the lock released.

A batch found with ``"complete": false`` and a free lock was cut short. Whoever
finds it (``dstui status``, the supervisor, the TUI's takeover, ``--resume``)
settles it with :func:`settle`: every run it names but never laid out gets a
folder whose status is failed, with the reason, so every run is listed, the
supervisor can launch the others and finalize the batch, and ``dstui run SPEC
--resume BATCH`` creates the missing ones. The real env values of a run are
written before its folder, so a run folder that exists is whole.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dstui.core import names, paths, run_status
from dstui.core.credential_text import strip_credentials
from dstui.core.errors import DstuiError, LockHeld
from dstui.core.rundir import BATCH_FILE, BatchDir, RunDir, list_batches, write_json_atomic
from dstui.core.secrets import prune_private, redact
from dstui.execute import backends, launch
from dstui.execute.batch_lock import BatchLock, is_supervised

if TYPE_CHECKING:  # pragma: no cover
    from dstui.execute.batch import Plan

TEMP_PREFIX = ".creating-"
STALE_TEMP_S = 30.0  # a hidden folder this old and unlocked was left by a `dstui run` killed before renaming it
COMPLETE = "complete"  # batch.json: false while being laid out; absent in batches older than this rule
PROBLEM = "creation_problem"  # batch.json: what settling found, shown by `dstui status` and `dstui run`
NEVER_CREATED = "never created: `dstui run` stopped while laying out the batch"


def create(p: Plan, *, runs_root: Path | None = None, parallel: int = 0, tracking_uri: str | None = None) -> BatchDir:
    """Lay out a new batch of ``p``; whole when this returns, removed when it raises."""
    root = runs_root or paths.runs_dir()
    root.mkdir(parents=True, exist_ok=True)
    tmp = BatchDir(Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=root)))
    lock = BatchLock(tmp)
    lock.acquire()  # held through the rename: the batch is never seen unlocked and incomplete
    b: BatchDir | None = None
    try:
        b = claim(tmp, root, p.spec.name, lambda bid: info_of(p, bid, parallel, tracking_uri))
        prune_private()  # the real env values of batches whose folder was deleted
        for run in p.runs:
            launch.prepare(b.path, run, p.ds_configs[run.name], revision=p.revisions.get(run.revision))
        b.update_info(**{COMPLETE: True})
        return b
    except BaseException:
        # a failure we see (a full disk, Ctrl-C): the batch was never handed to anyone, so it goes
        with contextlib.suppress(OSError):
            shutil.rmtree(b.path if b is not None else tmp.path)
        raise
    finally:
        lock.release()


def info_of(p: Plan, batch_id: str, parallel: int, tracking_uri: str | None) -> dict[str, Any]:
    """batch.json of a new batch."""
    return {
        "id": batch_id,
        "experiment": p.spec.name,
        "spec_path": str(p.spec_path),
        "spec": redact(p.spec.model_dump(mode="json")),
        "runs": [r.name for r in p.runs],
        "parallel": parallel,
        "created": time.time(),
        "cwd": os.getcwd(),
        # without credentials: the supervisor takes them from MLFLOW_TRACKING_URI (store.resolve_uri)
        "tracking_uri": strip_credentials(tracking_uri or paths.tracking_uri()),
        "revisions": p.revisions,
        **executor_info(p),
    }


def executor_info(p: Plan) -> dict[str, Any]:
    """batch.json's executor and its options (e.g. Slurm's job options), for the supervisor's backend."""
    return {"executor": p.spec.executor, backends.OPTIONS: backends.get(p.spec.executor).batch_options(p.spec)}


def claim(tmp: BatchDir, root: Path, name: str, info_of: Callable[[str], dict[str, Any]]) -> BatchDir:
    """Rename the prepared hidden folder to a free batch id, its batch.json saying "not complete yet".

    Renaming onto a batch that exists fails (it is not empty), so two starts in the
    same second never share a folder.
    """
    base = new_batch_id(name)
    for n in range(1000):
        bid = base if n == 0 else f"{base}-{n}"
        final = names.child_path(root, bid)
        write_json_atomic(tmp.batch_file, {**info_of(bid), COMPLETE: False})
        try:
            os.rename(tmp.path, final)
        except OSError as e:
            if e.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR):
                continue  # taken (two starts in one second)
            raise
        return BatchDir(final)
    raise DstuiError(f"could not create a batch folder for {name!r} in {root}")


def new_batch_id(name: str) -> str:
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def is_complete(batch: BatchDir) -> bool:
    """False only for a batch being laid out now, or one whose laying out was cut short."""
    return batch.info().get(COMPLETE, True) is not False


def run_is_whole(rd: RunDir) -> bool:
    """A run folder is whole once its status.json exists: :func:`dstui.execute.launch.prepare` writes it last."""
    return rd.status_file.is_file()


def settle(batch: BatchDir, *, locked: bool = False) -> str | None:
    """Finish what a cut-short creation left: missing runs become failed ones; the batch is complete.

    Returns the note written to batch.json (None when there was nothing to do).
    ``locked``: the caller holds the batch lock (the supervisor); otherwise it is
    taken here, and a batch whose lock is held (still being laid out, or looked
    after) is left alone.
    """
    if is_complete(batch):
        return None
    if not locked:
        lock = BatchLock(batch)
        try:
            lock.acquire()
        except (LockHeld, OSError):
            return None
        try:
            return settle(batch, locked=True)
        finally:
            lock.release()
    info = batch.info()
    listed = [n for n in info.get("runs", []) if names.is_safe(n, names.RUN_NAME_MAX)]
    missing = [n for n in listed if not run_is_whole(RunDir(batch.path / n))]
    now = time.time()
    for name in missing:
        rd = RunDir(batch.path / name)
        rd.path.mkdir(exist_ok=True)
        run_status.ended(rd, run_status.FAILED, NEVER_CREATED, name=name, steps_done=0, ended=now)
    note = None
    if missing:
        spec = info.get("spec_path") or "SPEC"
        note = (f"{len(missing)} of {len(listed)} runs were never laid out ({NEVER_CREATED}); "
                f"`dstui run {spec} --resume {batch.id}` creates them")  # fmt: skip
    batch.update_info(**{COMPLETE: True, PROBLEM: note})
    return note


def settle_all(runs_root: Path | None = None) -> list[str]:
    """Settle every cut-short batch under a runs folder and drop the hidden folders killed starts left.

    What ``dstui status`` calls before it lists anything, so every run is listed.
    Returns the notes written (one per batch that had missing runs).
    """
    root = runs_root or paths.runs_dir()
    notes = []
    for b in list_batches(root):
        if not is_complete(b):
            note = settle(b)
            if note:
                notes.append(f"{b.id}: {note}")
    remove_stale_temp(root)
    return notes


def remove_stale_temp(runs_root: Path | None = None) -> int:
    """Remove the hidden folders of starts killed before their batch was renamed into place; how many.

    Its creator locks the folder right after making it and renames it within
    moments, so one older than :data:`STALE_TEMP_S` whose lock is free was left
    by a creator that died.
    """
    root = runs_root or paths.runs_dir()
    try:
        entries = [e for e in root.iterdir() if e.name.startswith(TEMP_PREFIX) and e.is_dir() and not e.is_symlink()]
    except OSError:
        return 0
    removed = 0
    for entry in entries:
        b = BatchDir(entry)
        with contextlib.suppress(OSError):
            if time.time() - entry.stat().st_mtime > STALE_TEMP_S and not is_supervised(b):
                shutil.rmtree(entry)
                removed += 1
    return removed


def find_batch(ref: str, runs_root: Path | None = None) -> BatchDir | None:
    """A batch by id (under the runs folder) or by its folder's path; None when there is none.

    Any batch, not only the newest: what ``--resume BATCH`` and ``retry BATCH/RUN`` address.
    """
    root = runs_root or paths.runs_dir()
    candidates = [root / ref] if names.is_safe(ref) else []
    candidates.append(Path(ref))
    for c in candidates:
        if c.name.startswith(TEMP_PREFIX) or not (c / BATCH_FILE).is_file():
            continue
        return BatchDir(c.resolve())
    return None
