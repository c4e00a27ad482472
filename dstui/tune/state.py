"""A search on disk: what was probed, what is in flight, what was decided; what makes `dstui tune` resumable.

``<runs>/tune/<experiment>-<key>/`` (the key hashes the spec's settings, tune
block and revisions: the same spec finds its search again)::

    state.json     the search: its batch, every probe's measurement, the probe in flight, the outcome
    space.yaml     the candidates as a spec (probe settings): the batch's spec
    grid.yaml      the same candidates with the spec's own steps: the exhaustive `dstui run` of the space
    winner.yaml    the winner's spec, ready for `dstui run`
    tuning.md, tuning_predicted_vs_measured.png   the report section, on its own
    tune.lock      flock: one `dstui tune` per search

The probe in flight is written *before* its run is laid out, and each probe's
measurement right after it ends, so a `dstui tune` killed at any point finds
the probe's run (its supervisor lives on in its own session), follows it to
its end and never probes a candidate twice.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dstui.core import names
from dstui.core.holder_lock import HolderLock
from dstui.core.rundir import read_json, write_json_atomic
from dstui.spec.experiment import ExperimentSpec
from dstui.tune.probe_rules import StepTime

STATE_FILE = "state.json"
SPACE_FILE = "space.yaml"
GRID_FILE = "grid.yaml"
WINNER_FILE = "winner.yaml"
REPORT_FILE = "tuning.md"
CHART_FILE = "tuning_predicted_vs_measured.png"
LOCK_FILE = "tune.lock"
VERSION = 1


@dataclass
class Probe:
    """One probe: the prediction it was chosen on, and what its run measured."""

    candidate: str
    run: str
    predicted_s: float | None = None
    predicted_sd: float | None = None  # of the log
    started: float | None = None  # the run's launch (status.json)
    ended: float | None = None
    state: str = "running"  # the run's final state, or "running"
    outcome: str = ""  # precise / slower / steps / time box / failed / out of memory
    reason: str | None = None
    step_time: float | None = None
    half: float | None = None  # 95% half-width of the mean step time
    steps: int = 0  # timed steps
    tokens_per_s: float | None = None
    mem_peak: float | None = None
    mlflow_run_id: str | None = None

    @property
    def time(self) -> StepTime:
        """Its mean step time and 95% interval as the search weighs them (zeros where nothing was measured)."""
        return StepTime(self.step_time or 0.0, self.half or 0.0, self.steps)

    @property
    def usable(self) -> bool:
        """A mean step time over at least two timed steps (a time-boxed probe may have one)."""
        return self.step_time is not None and self.half is not None and self.steps >= 2

    @property
    def wall_s(self) -> float:
        return max(0.0, (self.ended or 0.0) - (self.started or 0.0)) if self.started and self.ended else 0.0


@dataclass
class TuneState:
    spec_path: str
    experiment: str
    key: str
    batch: str | None = None
    created: float = field(default_factory=time.time)
    probes: list[Probe] = field(default_factory=list)
    in_flight: str | None = None  # candidate name
    oom_pruned: dict[str, str] = field(default_factory=dict)  # left out by what probes taught (an OOM, measured peaks)
    status: str = "running"  # running / done
    stop_reason: str = ""
    winner: str | None = None
    search_s: float = 0.0  # wall time of the tuner's own sessions (adds up over resumes)
    version: int = VERSION

    def probe_of(self, candidate: str) -> Probe | None:
        return next((p for p in self.probes if p.candidate == candidate), None)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TuneState:
        probes = [Probe(**{k: v for k, v in p.items() if k in Probe.__dataclass_fields__}) for p in data.get("probes", [])]
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "probes"}
        return cls(**known, probes=probes)


def search_key(spec: ExperimentSpec) -> str:
    """What makes two invocations the same search: the settings, the tune block and the revisions."""
    payload = {"settings": spec.settings, "tune": spec.tune.model_dump(mode="json") if spec.tune else None,
               "revisions": [r.model_dump(mode="json") for r in spec.revisions],
               "gpu_memory_gib": spec.gpu_memory_gib}  # fmt: skip
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:12]


def folder_for(spec: ExperimentSpec, runs_root: Path) -> Path:
    root = runs_root / "tune"
    root.mkdir(parents=True, exist_ok=True)
    return names.child_path(root, f"{spec.name}-{search_key(spec)}")


def load(folder: Path) -> TuneState | None:
    data = read_json(folder / STATE_FILE)
    if not isinstance(data, dict) or data.get("version") != VERSION:
        return None
    try:
        return TuneState.from_json(data)
    except (TypeError, ValueError):
        return None


def save(folder: Path, st: TuneState) -> None:
    write_json_atomic(folder / STATE_FILE, st.to_json())


class SearchLock(HolderLock):
    """One `dstui tune` per search: an flock the kernel releases when its holder dies."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder / LOCK_FILE, lambda holder: f"this search is already running ({holder}); its folder: {folder}")
