"""The runs home as immutable snapshots, read off the UI thread (no textual here).

The app's one home worker (:meth:`dstui.tui.app.DstuiApp.read_home`) calls
:meth:`HomeReader.take` every tick and posts the :class:`HomeSnapshot` it
returns; screens only render snapshots, so the UI thread reads no file and
probes no lock (issue 39.4: the Runs screen read up to 30 batches, their
supervisor locks, every run's status and the bisect progress on the UI thread,
every tick; the app scanned for failures there too).

What a snapshot holds: the newest batches (their batch.json, runs in launch
order with each run's status.json, whether a live supervisor holds each
unfinished one), the bisects worth a line, and the failure alerts that are new
since the previous snapshot. Reading is cheap on a big home: a JSON file is
parsed again only when its stat (inode, mtime, size) changed, the batch list is
made every ``relist_s`` (it reads every batch.json of the home), and a finished
run's mean figures are computed once.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dstui.core import paths
from dstui.core.rundir import FINAL_STATES, BatchDir, RunDir, list_batches, read_json
from dstui.tui.failure_watch import Alert, FailureWatch
from dstui.tui.frozen import FrozenDict, freeze
from dstui.usecases import run_figures

MAX_BATCHES = 30
#: a take spends at most this long averaging finished runs' step records (a run without a summary);
#: the others show their last step until a later take (the first snapshot must not wait on them)
MEANS_BUDGET_S = 0.2
RELIST_S = 5.0  # a batch launched meanwhile is listed within 5 s (at once after a launch here: relist=True)
EMPTY: Mapping[str, Any] = FrozenDict()


@dataclass(frozen=True)
class RunView:
    name: str
    path: Path
    status: Mapping[str, Any]  # status.json, read-only (core/rundir's keys)
    warmup: int  # its settings' warmup_steps (spec.json)
    speed: run_figures.Speed  # means after warm-up once it ended, else its last step

    @property
    def state(self) -> str:
        return str(self.status.get("state") or "unknown")

    @property
    def dir(self) -> RunDir:
        return RunDir(self.path)


@dataclass(frozen=True)
class BatchView:
    id: str
    path: Path
    info: Mapping[str, Any]  # batch.json, read-only
    runs: tuple[RunView, ...]
    supervised: bool  # a live supervisor holds its lock (False once finalized)

    @property
    def dir(self) -> BatchDir:
        return BatchDir(self.path)

    def run(self, name: str) -> RunView | None:
        return next((r for r in self.runs if r.name == name), None)

    @property
    def unfinished(self) -> tuple[RunView, ...]:
        return tuple(r for r in self.runs if r.state not in FINAL_STATES)


@dataclass(frozen=True)
class HomeSnapshot:
    root: Path
    taken: float  # time.time() when it was read
    batches: tuple[BatchView, ...]  # newest first
    bisects: tuple[Mapping[str, Any], ...] = ()  # progress of the bisects worth a line (dstui.bisect.store)
    alerts: tuple[Alert, ...] = ()  # runs that went wrong since the previous snapshot
    problem: str | None = None  # why the home could not be read this time (the last good batches are kept)
    label: str = ""  # where the runs are, when dstui chose it (the header says it): core.paths.home_label

    def batch(self, batch_id: str | None) -> BatchView | None:
        return next((b for b in self.batches if b.id == batch_id), None) if batch_id else None


@dataclass
class _Stamped:
    stamp: tuple[int, int, int]
    value: Any
    settled: bool  # the file was older than STILL_S when read: an equal stamp means the same contents


STILL_S = 1.0  # a file written within a timestamp's granularity of another write may keep its stamp


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


@dataclass
class HomeReader:
    """Takes snapshots of a runs home; remembers what it parsed so an unchanged file costs one stat."""

    root: Path | None = None  # None: the home dstui chooses (DSTUI_HOME, a project's runs/, ...)
    relist_s: float = RELIST_S
    max_batches: int = MAX_BATCHES
    failures: FailureWatch = field(default_factory=FailureWatch)
    _json: dict[Path, _Stamped] = field(default_factory=dict)
    _speeds: dict[Path, tuple[Any, run_figures.Speed]] = field(default_factory=dict)
    _runs: dict[Path, tuple[Any, list[RunDir]]] = field(default_factory=dict)
    _listed: list[BatchDir] = field(default_factory=list)
    _listed_at: float = float("-inf")
    _previous: tuple[BatchView, ...] = ()
    _label: str | None = None
    _means_until: float = 0.0

    def take(self, *, relist: bool = False, now: float | None = None) -> HomeSnapshot:
        now = time.time() if now is None else now
        self._means_until = time.monotonic() + MEANS_BUDGET_S
        root = self.root or paths.runs_dir()
        if self._label is None:  # how dstui chose the home: looked for once (it searches the folders up from here)
            self._label = paths.home_label(implicit_only=True) if self.root is None else ""
        try:
            batches = tuple(self._batches(root, now, relist))
            bisects = tuple(freeze(p) for p in _bisects(root))
        except OSError as e:  # a home on a disk that went away: say so, keep showing what was there
            return HomeSnapshot(root, now, self._previous, problem=f"cannot read {root}: {e}", label=self._label)
        self._previous = batches
        alerts = tuple(self.failures.scan(((b.id, b.info, ((r.name, r.status) for r in b.runs)) for b in batches), now))
        return HomeSnapshot(root, now, batches, bisects, alerts, label=self._label)

    def _batches(self, root: Path, now: float, relist: bool) -> Iterator[BatchView]:
        if relist or now - self._listed_at >= self.relist_s:
            self._listed_at = now
            self._listed = list_batches(root)[: self.max_batches]
            # what was read of batches no longer listed is forgotten (a home's old batches are many)
            listed = {b.path for b in self._listed}
            self._json = {p: v for p, v in self._json.items() if p.parent in listed or p.parent.parent in listed}
            self._runs = {p: v for p, v in self._runs.items() if p in listed}
            self._speeds = {p: v for p, v in self._speeds.items() if p.parent in listed}
        for b in self._listed:
            view = self._batch(b)
            if view is not None:
                yield view

    def _batch(self, b: BatchDir) -> BatchView | None:
        info = self._read(b.batch_file)
        if info is None:  # the batch was removed since it was listed
            return None
        runs = tuple(self._run(rd) for rd in self._run_dirs(b, info))
        supervised = False if info.get("finalized") else _supervised(b)
        return BatchView(b.id, b.path, info, runs, supervised)

    def _run(self, rd: RunDir) -> RunView:
        st = self._read(rd.status_file) or EMPTY
        settings = (self._read(rd.spec_file) or EMPTY).get("settings") or EMPTY
        warmup = run_figures.warmup_of(settings)
        return RunView(rd.name, rd.path, st, warmup, self._speed(rd, st, warmup))

    def _speed(self, rd: RunDir, st: Mapping[str, Any], warmup: int) -> run_figures.Speed:
        """A finished run's means are computed once per status it ends with (they read its step records)."""
        if st.get("state") not in FINAL_STATES:
            return run_figures.last_speed(st)
        known = self._speeds.get(rd.path)
        if known is not None and known[0] is st:
            return known[1]
        if run_figures.summary_speed(st) is None and time.monotonic() > self._means_until:
            return run_figures.last_speed(st)  # its records are averaged in a later take
        found = run_figures.speed(st, rd, warmup)
        self._speeds[rd.path] = (st, found)
        return found

    def _read(self, path: Path) -> Any:
        """A JSON file, frozen; parsed again only when its stat changed. None when it is not there."""
        stamp = _stamp(path)
        if stamp is None:
            self._json.pop(path, None)
            return None
        known = self._json.get(path)
        if known is not None and known.settled and known.stamp == stamp:
            return known.value
        value = freeze(read_json(path, None))
        # a file rewritten within the clock's granularity (a few ms on ext4), into a reused inode, at the
        # same size, keeps its stamp: only a file that had been still for a while is trusted by stamp
        settled = time.time_ns() - stamp[1] > STILL_S * 1e9
        if known is not None and known.value == value:
            value = known.value  # unchanged: the same object (a finished run's figures are not computed again)
        self._json[path] = _Stamped(stamp, value, settled)
        return value

    def _run_dirs(self, b: BatchDir, info: Mapping[str, Any]) -> list[RunDir]:
        """The batch's runs in launch order, listed again when its batch.json changed (or at a relist)."""
        known = self._runs.get(b.path)
        if known is None or known[0] is not info:
            known = (info, b.runs())
            self._runs[b.path] = known
        return known[1]


def _supervised(b: BatchDir) -> bool:
    # the takeover module imports the supervisor's modules: off the TUI's start path
    from dstui.usecases import takeover

    return takeover.supervised(b)


BISECT_RECENT_S = 600.0  # a finished bisect's answer stays on the Runs screen this long


def _alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, TypeError, ValueError):
        return False
    return True


def shown_bisects(progress: list[dict[str, Any]], now: float | None = None) -> list[dict[str, Any]]:
    """Bisects worth a line: running (their process is alive) or finished in the last minutes."""
    now = time.time() if now is None else now

    def worth(p: dict[str, Any]) -> bool:
        if p.get("state") == "running":
            return _alive(p.get("pid"))
        return now - float(p.get("updated", 0)) < BISECT_RECENT_S

    return [p for p in progress if worth(p)]


def _bisects(root: Path) -> list[dict[str, Any]]:
    from dstui.bisect.store import list_progress  # the bisect stage: only once the home is read

    return shown_bisects(list_progress(root))
