"""Run and batch folders: the contract between launcher, supervisor, CLI and TUI.

Anything that wants to know about a run reads its folder, so a run launched by
the CLI can be watched by a TUI started an hour later. Writes are atomic
(temp file + rename) so a reader never sees half a status.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dstui.core import run_files
from dstui.core.names import RUN_NAME_MAX, is_safe

ACTIVE_STATES = ("queued", "starting", "running")
LIVE_STATES = ("running", "starting")  # a job was started and has not ended
FINAL_STATES = ("done", "failed", "killed", "skipped")  # skipped: predicted OOM, never launched
# What `dstui retry` (and the TUI's retry) queues again unasked: runs that gave no measurement. A done
# run is queued again only on request (--force): its new attempt then replaces it in reports.
RETRIABLE_STATES = ("failed", "killed", "skipped")

# Names of the files in a run folder that processes outside this module write or skip.
EXIT_FILE = "exit.json"  # written by the job's wrapper (dstui.execute.injob.wrap), stdlib only
CANCEL_FILE = "cancel.request"  # a request, not a record: never uploaded as an artifact
# a request to end training gracefully after the current step (`dstui tune`'s probes): the
# bundled runners look for it beside their metrics file, and end as a run that finished
STOP_FILE = "stop.request"
PRIVATE_SPEC_FILE = "spec.private.json"  # where older versions kept the unmasked spec; never uploaded
PRIVATE_FILES = (CANCEL_FILE, STOP_FILE, PRIVATE_SPEC_FILE)
BATCH_FILE = "batch.json"
LOCK_FILE = "supervisor.lock"  # flock held by the batch's supervisor; the wrapper tests it too
SUPERVISOR_LOG = "supervisor.log"
PHASE_FILE = "phase.json"  # rank 0 of a bundled runner: its newest phase mark, as it happens


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, default=str)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


#: the largest JSON file of a run or batch read (batch.json of 10,000 runs is ~2 MB)
MAX_JSON_BYTES = 32 << 20


def read_json(path: Path, default: Any = None) -> Any:
    """A JSON file of a run or batch folder, ``default`` when it is missing, unreadable or not JSON.

    Read as untrusted (:mod:`dstui.core.run_files`): never through a link, never a
    FIFO or device, at most :data:`MAX_JSON_BYTES` (a longer file is not JSON here).
    """
    try:
        raw = run_files.read_small(path, MAX_JSON_BYTES)
    except (FileNotFoundError, NotADirectoryError, run_files.NotRegular):
        return default
    if raw is None:
        return default
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return default


def merge_status(rd: RunDir, fields: dict[str, Any]) -> dict[str, Any]:
    """status.json with ``fields`` merged in, written whole (atomically); the new status.

    The one writer of the file: :meth:`RunDir.update_status` for any field but the state,
    :mod:`dstui.core.run_status`'s transitions for the state (tests/unit/test_architecture.py
    holds every other module to those two).
    """
    st = rd.status()
    st.update(fields)
    st["updated"] = time.time()
    write_json_atomic(rd.status_file, st)
    return st


@dataclass(frozen=True)
class RunDir:
    path: Path

    # file names: the layout lives here and nowhere else
    @property
    def status_file(self) -> Path:
        return self.path / "status.json"

    @property
    def metrics_file(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def system_file(self) -> Path:
        return self.path / "system.jsonl"

    @property
    def log_file(self) -> Path:
        return self.path / "stdout.log"

    @property
    def spec_file(self) -> Path:
        return self.path / "spec.json"

    @property
    def ds_config_file(self) -> Path:
        return self.path / "ds_config.json"

    @property
    def cmd_file(self) -> Path:
        return self.path / "cmd.txt"

    @property
    def ingest_file(self) -> Path:
        return self.path / "ingest.json"

    @property
    def exit_file(self) -> Path:
        return self.path / EXIT_FILE

    @property
    def private_spec_file(self) -> Path:
        """spec.json unmasked: outside the run and batch folders (see core.secrets).

        Imported here: the job's wrapper imports this module and stays light.
        """
        from dstui.core import secrets

        return secrets.private_file(self.path)

    @property
    def cancel_file(self) -> Path:
        return self.path / CANCEL_FILE

    @property
    def stop_file(self) -> Path:
        return self.path / STOP_FILE

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def batch(self) -> BatchDir:
        return BatchDir(self.path.parent)

    def status(self) -> dict[str, Any]:
        return read_json(self.status_file, {}) or {}

    def update_status(self, **fields: Any) -> dict[str, Any]:
        """Merge fields into status.json; a state changes only through :mod:`dstui.core.run_status`."""
        if "state" in fields:
            raise ValueError("a run's state changes through dstui.core.run_status's transitions, not update_status")
        return merge_status(self, fields)

    @property
    def state(self) -> str:
        return self.status().get("state", "unknown")

    def spec(self) -> dict[str, Any]:
        return read_json(self.spec_file, {}) or {}

    def settings(self) -> dict[str, Any]:
        """The run's resolved settings from spec.json (``{}`` when absent): what it was launched with.

        A plain dict, not :class:`dstui.spec.settings.Settings`: the core imports no
        stage, and readers of old or foreign run folders must not fail on them.
        """
        return self.spec().get("settings") or {}

    def log_tail(self, n_bytes: int = 8192) -> str:
        """The last ``n_bytes`` of the job's log ("" when it is missing, or not a regular file of its own)."""
        try:
            return run_files.read_tail(self.log_file, n_bytes).decode("utf-8", "replace")
        except (FileNotFoundError, run_files.NotRegular):
            return ""

    def note_file_problem(self, why: str) -> bool:
        """A file of this run dstui refused to read (``NAME is a FIFO: not read``), kept in status.json
        under its name (``file_problems``) once; True when it is new."""
        name = why.split(" ", 1)[0]
        st = self.status()
        problems = st.get("file_problems") if isinstance(st.get("file_problems"), dict) else {}
        if problems.get(name) == why:
            return False
        self.update_status(file_problems={**problems, name: why})
        return True


@dataclass(frozen=True)
class BatchDir:
    path: Path

    @property
    def id(self) -> str:
        return self.path.name

    @property
    def batch_file(self) -> Path:
        return self.path / BATCH_FILE

    @property
    def lock_file(self) -> Path:
        return self.path / LOCK_FILE

    @property
    def log_file(self) -> Path:
        return self.path / SUPERVISOR_LOG

    def info(self) -> dict[str, Any]:
        return read_json(self.batch_file, {}) or {}

    def update_info(self, **fields: Any) -> dict[str, Any]:
        info = self.info()
        info.update(fields)
        write_json_atomic(self.batch_file, info)
        return info

    def runs(self) -> list[RunDir]:
        """Runs in launch order (as recorded in batch.json; folders otherwise)."""
        order = self.info().get("runs")
        if order:
            # names come from batch.json: only safe ones, so a tampered file cannot point outside
            return [RunDir(self.path / name) for name in order if is_safe(name, RUN_NAME_MAX) and (self.path / name).is_dir()]
        try:
            return sorted(
                (RunDir(p) for p in self.path.iterdir() if (p / "spec.json").exists()),
                key=lambda r: r.spec().get("order", 0),
            )
        except FileNotFoundError:
            return []

    def is_finished(self) -> bool:
        return all(r.state in FINAL_STATES for r in self.runs())


def list_batches(root: Path) -> list[BatchDir]:
    """Batches under a runs folder, newest first."""
    if not root.is_dir():
        return []
    # a hidden folder is a batch still being laid out (dstui.execute.creation): not listed until renamed
    batches = [BatchDir(p) for p in root.iterdir() if not p.name.startswith(".") and (p / "batch.json").exists()]
    return sorted(batches, key=lambda b: b.info().get("created", 0), reverse=True)


def find_run(root: Path, ref: str) -> RunDir | None:
    """A run by path, 'batch/run', or bare run name (newest batch first)."""
    p = Path(ref)
    if (p / "status.json").exists():
        return RunDir(p.resolve())
    if (root / ref / "status.json").exists():
        return RunDir((root / ref).resolve())
    for batch in list_batches(root):
        cand = batch.path / ref
        if (cand / "status.json").exists():
            return RunDir(cand)
    return None
