"""Which GPUs and CPU cores of this machine runs of *other* batches hold: each is one resource.

Each batch's supervisor shares GPUs among its own runs (:mod:`~dstui.execute.gpu_share`).
Two batches started one after the other used to take the same GPUs, since
neither knew of the other. Now every local run is written into one ledger
per user and machine (``<cache>/gpus/held.json``) when it starts, with its GPUs
and the cores it claims (:mod:`~dstui.execute.core_share`), under an
exclusive lock that is held from "which GPUs and cores are free?" to "the run
holds them"; a supervisor asks the ledger before starting a run and waits while
what it needs is held elsewhere. The same entries tell each run what ran
beside it (:mod:`~dstui.execute.overlap`).

An entry lasts while its job's process group lives and its run has not ended,
so a killed supervisor or a deleted run folder never blocks the GPUs for good.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dstui.core import paths
from dstui.core.rundir import FINAL_STATES, RunDir, read_json, write_json_atomic

LEDGER_ENV = "DSTUI_GPU_LEDGER"  # another folder for the ledger (tests; a shared node-local dir)


def ledger_dir() -> Path:
    return Path(os.environ.get(LEDGER_ENV) or paths.cache_dir() / "gpus")


@dataclass(frozen=True)
class Holder:
    """A live run of some batch and the GPUs it holds."""

    run_path: str
    batch: str
    run: str
    gpus: tuple[int, ...]
    pgid: int | None
    cores: int = 0  # the CPU cores it claims (core_share.cores_needed); 0 in entries older than that
    since: float | None = None  # when it was launched (None in entries older than that)


@dataclass(frozen=True)
class Ended:
    """A run that held part of the machine and ended: what ran beside a run that was still going then."""

    run_path: str
    batch: str
    run: str
    start: float
    end: float


RECENT_FILE = "recent.json"  # runs that ended: kept a day, the newest 500
RECENT_KEEP_S, RECENT_MAX = 86400.0, 500


def _ended_at(h: Holder) -> float:
    """When a holder's run ended: its job's exit (exit.json), else its supervisor's word, else now."""
    rd = RunDir(Path(h.run_path))
    for value in (read_json(rd.exit_file, {}).get("ended") if rd.exit_file.exists() else None, rd.status().get("ended")):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return time.time()


def _as_ended(h: Holder) -> Ended | None:
    return Ended(h.run_path, h.batch, h.run, h.since, _ended_at(h)) if h.since is not None else None


def _alive(h: Holder) -> bool:
    from dstui.execute.process_group import job_alive

    rd = RunDir(Path(h.run_path))
    if not rd.path.is_dir() or rd.state in FINAL_STATES:
        return False
    st = rd.status()
    return job_alive(st) if h.pgid else rd.state in ("queued", "starting", "running")


class Ledger:
    """The ledger, opened under its lock: read who holds what, add what a launch took."""

    def __init__(self, folder: Path) -> None:
        self.file = folder / "held.json"
        self.recent_file = folder / RECENT_FILE
        self.holders: list[Holder] = []
        self.gone: list[Holder] = []  # in the file, no longer alive: their runs ended (or their folders went)
        self._as_read: list[Holder] = []

    def load(self) -> None:
        try:
            raw = json.loads(self.file.read_text())
        except (OSError, ValueError):
            raw = []
        found = []
        for e in raw if isinstance(raw, list) else []:
            with contextlib.suppress(KeyError, TypeError, ValueError):
                since = e.get("since")
                found.append(Holder(str(e["run_path"]), str(e["batch"]), str(e["run"]),
                                    tuple(int(g) for g in e["gpus"]), e.get("pgid"), int(e.get("cores") or 0),
                                    float(since) if isinstance(since, (int, float)) else None))  # fmt: skip
        alive = {id(h) for h in found if _alive(h)}
        self.holders = [h for h in found if id(h) in alive]
        self.gone = [h for h in found if id(h) not in alive]
        self._as_read = list(found)

    def recent(self) -> list[Ended]:
        """Runs that ended lately (their holders dropped), newest last."""
        try:
            raw = json.loads(self.recent_file.read_text())
        except (OSError, ValueError):
            return []
        out = []
        for e in raw if isinstance(raw, list) else []:
            with contextlib.suppress(KeyError, TypeError, ValueError):
                out.append(Ended(str(e["run_path"]), str(e["batch"]), str(e["run"]), float(e["start"]), float(e["end"])))
        return out

    def save(self) -> None:
        """Write the ledger back, only when it changed: a waiting supervisor opens it twice a second.

        Holders whose runs ended go to ``recent.json`` first: a run still going was beside them."""
        if self.holders == self._as_read:
            return
        ended = [e for h in self.gone if (e := _as_ended(h)) is not None]
        if ended:
            now = time.time()
            keep = [e for e in self.recent() if e.end > now - RECENT_KEEP_S] + ended
            write_json_atomic(self.recent_file, [e.__dict__ for e in keep[-RECENT_MAX:]])
        write_json_atomic(self.file, [h.__dict__ | {"gpus": list(h.gpus)} for h in self.holders])

    def held_elsewhere(self, batch_path: Path) -> list[Holder]:
        """Live holders that are not runs of this batch (its own runs are shared by gpu_share)."""
        own = str(batch_path.resolve())
        return [h for h in self.holders if str(Path(h.run_path).parent) != own]

    def add(self, rd: RunDir, gpus: list[int], cores: int = 0) -> None:
        st = rd.status()
        self.holders = [h for h in self.holders if h.run_path != str(rd.path)]
        self.holders.append(Holder(str(rd.path), rd.batch.id, rd.name, tuple(gpus), st.get("pgid"), cores,
                                   st.get("started") or time.time()))  # fmt: skip


def read() -> tuple[list[Holder], list[Ended]]:
    """The live holders and the runs that ended lately, read without the lock (files are replaced whole).

    Ended: those in ``recent.json`` and holders whose run ended but that no writer dropped yet."""
    ledger = Ledger(ledger_dir())
    ledger.load()
    return ledger.holders, ledger.recent() + [e for h in ledger.gone if (e := _as_ended(h)) is not None]


@contextlib.contextmanager
def opened() -> Iterator[Ledger]:
    """The ledger under an exclusive flock (released when the block ends); saved on the way out."""
    folder = ledger_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(folder / "held.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            ledger = Ledger(folder)
            ledger.load()
            yield ledger
            ledger.save()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def runs_text(holders: list[Holder], *, limit: int = 3) -> str:
    """'batch lrsweep-20261125-101010 (runs z1-r0, z2-r0)' for a waiting run's phase or a CLI note."""
    by_batch: dict[str, list[str]] = {}
    for h in holders:
        by_batch.setdefault(h.batch, []).append(h.run)
    parts = []
    for b, runs in by_batch.items():
        shown = ", ".join(runs[:limit]) + (f", +{len(runs) - limit}" if len(runs) > limit else "")
        parts.append(f"batch {b} (run{'s' if len(runs) > 1 else ''} {shown})")
    return ", ".join(parts)


def holders_text(holders: list[Holder]) -> str:
    """'batch smoke-20261125-101010 (GPUs 0,1)' for a waiting run's phase or a CLI note."""
    by_batch: dict[str, set[int]] = {}
    for h in holders:
        by_batch.setdefault(h.batch, set()).update(h.gpus)
    return ", ".join(f"batch {b} (GPU{'s' if len(g) > 1 else ''} {','.join(map(str, sorted(g)))})" for b, g in by_batch.items())
