"""The spec file's models: revisions, explicit conditions, Slurm and guard options, the experiment, one run.

:class:`ExperimentSpec` is what a YAML spec holds; :class:`RunSpec` is one
condition under one revision and one repeat, with the stable key that names the
same run in any batch. The settings of a condition are :mod:`dstui.spec.settings`.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dstui.core import executors
from dstui.spec.messages import one_of
from dstui.spec.settings import SUPERVISION_ONLY, Settings, StrictModel, safe_name
from dstui.spec.tune_block import TuneOptions

# what dstui.revisions accepts as a PyPI release (after a leading '==' or 'v')
PYPI_VERSION = re.compile(r"\d+(\.\d+)*([a-zA-Z0-9.+!-]*)")


class Revision(StrictModel):
    """A DeepSpeed revision to run every condition against (see revisions.py)."""

    name: str
    pypi: str | None = Field(None, description="A DeepSpeed release from PyPI, e.g. '0.18.0'.")
    git: str | None = Field(None, description="A local clone; with 'ref'.")
    ref: str | None = Field(None, description="Branch, tag or commit in 'git'.")
    path: str | None = Field(None, description="A working tree used as it is now.")
    installed: bool = Field(False, description="The DeepSpeed of the current environment.")
    install: Literal["auto", "pip", "source"] = Field(
        "auto",
        description="git revisions: 'auto' places the commit's source into a shared env when that is known to equal "
        "a pip build, else pip; 'pip' always pip-builds; 'source' requires the source env (an error when ineligible).",
    )

    _name_ok = field_validator("name")(classmethod(lambda cls, v: safe_name(v)))

    @field_validator("pypi")
    @classmethod
    def _version(cls, v: str | None) -> str | None:
        """Refused at load, with the file named, rather than when the revisions are resolved for a launch."""
        if v is not None and not PYPI_VERSION.fullmatch(v.strip().removeprefix("==").removeprefix("v")):
            raise ValueError(f"{v!r} is not a version number (e.g. '0.18.0')")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> Revision:
        sources = [self.pypi is not None, self.git is not None, self.path is not None, self.installed]
        if sum(sources) != 1:
            raise ValueError("give exactly one of pypi, git (+ref), path or installed: true")
        if self.git is not None and not self.ref:
            raise ValueError("'git' needs 'ref' (branch, tag or commit)")
        return self


class Condition(BaseModel):
    """An explicit named condition: a name plus setting overrides."""

    model_config = ConfigDict(extra="allow")
    name: str

    _name_ok = field_validator("name")(classmethod(lambda cls, v: safe_name(v)))


class SlurmOptions(StrictModel):
    """How each run goes to Slurm with ``executor: slurm`` (see docs/CLUSTERS.md).

    A run's ``nodes`` and ``gpus`` (ranks per node) give the job's nodes and tasks;
    these say where and with what else the job asks for.
    """

    partition: str | None = Field(None, description="sbatch --partition; None = the cluster's default.")
    account: str | None = Field(None, description="sbatch --account.")
    time_limit: str | None = Field(None, description="Per job: '30m', '2h', '90' (minutes) or Slurm's '[D-]HH:MM:SS'.")
    gpus_per_node: int | None = Field(None, ge=0, description="sbatch --gpus-per-node; None = as many as the run's ranks per node on a GPU run, none on CPU.")
    cpus_per_task: int = Field(1, ge=1, description="sbatch --cpus-per-task (one task per rank).")
    mem: str | None = Field(None, description="sbatch --mem per node, e.g. '64G'.")
    extra_sbatch: list[str] = Field(default_factory=list, description="More sbatch options, one per item, e.g. '--qos=high'.")
    max_jobs: int | None = Field(None, ge=1, description="At most this many of the batch's jobs pending or running at once; None = all.")
    requeue: int = Field(1, ge=0, description="> 0: jobs are requeueable (sbatch --requeue) and a PREEMPTED / NODE_FAIL job is submitted again this many times, in the same run folder and MLflow run; 0: --no-requeue.")

    @field_validator("time_limit")
    @classmethod
    def _slurm_time(cls, v: str | None) -> str | None:
        """Normalised to Slurm's [D-]HH:MM:SS; Slurm counts whole minutes."""
        if v is None:
            return v
        text = str(v).strip().lower()
        units = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
        num, unit = text.rstrip("smindh"), text[len(text.rstrip("smindh")):] or "m"
        if num.replace(".", "", 1).isdigit() and unit in units:
            secs = int(float(num) * units[unit])
        else:
            days, _, clock = text.rpartition("-")
            parts = clock.split(":")
            if not (days.isdigit() or not days) or not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3:
                raise ValueError("use '30m', '2h', '90' (minutes) or '[D-]HH:MM:SS'")
            h, m, s_ = ([0] * (3 - len(parts)) + [int(p) for p in parts]) if len(parts) > 1 else (0, int(parts[0]), 0)
            secs = int(days or 0) * 86400 + h * 3600 + m * 60 + s_
        if secs <= 0:
            raise ValueError("must be positive")
        d, rest = divmod(max(60, -(-secs // 60) * 60), 86400)
        clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:00"
        return f"{d}-{clock}" if d else clock


class Guard(StrictModel):
    """Live divergence/NaN guard (dstui/execute/guard.py): flag, and optionally stop, runs that go wrong."""

    baseline: str | None = Field(None, description="Condition whose loss the others follow; default: the spec's baseline.")
    rtol: float | None = Field(None, ge=0, description="Relative loss tolerance; with atol unset too, divergence is not checked.")
    atol: float | None = Field(None, ge=0, description="Absolute loss tolerance.")
    stop_on: list[Literal["nan", "divergence"]] = Field(
        default_factory=list, description="End a flagged run early (state killed) on these."
    )


class ExperimentSpec(StrictModel):
    name: str = Field(description="Experiment name; also the MLflow experiment.")
    description: str = ""
    settings: dict[str, Any] = Field(default_factory=dict, description="Base settings.")
    axes: dict[str, list[Any]] = Field(default_factory=dict, description="Cartesian product.")
    exclude: list[dict[str, Any]] = Field(default_factory=list, description="Partial matches to drop.")
    conditions: list[Condition] = Field(default_factory=list, description="Explicit conditions.")
    repeats: int = Field(1, ge=1, description="Runs per condition and revision.")
    revisions: list[Revision] = Field(default_factory=list, description="DeepSpeed revisions.")
    baseline: str | None = Field(None, description="Condition that reports compare against.")
    executor: str = Field(
        executors.DEFAULT,
        description="Where runs start: 'local' (this machine), 'slurm' (one Slurm job each), or another registered "
        "executor (dstui.core.executors).",
    )
    slurm: SlurmOptions = Field(default_factory=SlurmOptions, description="Slurm job options (executor: slurm).")
    guard: Guard = Field(default_factory=Guard, description="Live NaN/divergence guard.")
    skip_predicted_oom: bool = Field(False, description="Skip runs whose memory forecast exceeds the GPU's memory.")
    gpu_memory_gib: float | None = Field(
        None, gt=0, description="GPU memory to forecast against (default: GPU 0 of this machine)."
    )
    tune: TuneOptions | None = Field(
        None, description="`dstui tune`: the search space and limits (the settings give model, data, ranks)."
    )

    _name_ok = field_validator("name")(classmethod(lambda cls, v: safe_name(v)))

    @field_validator("executor")
    @classmethod
    def _known_executor(cls, v: str) -> str:
        # the registry's names, read where the spec may read them (the backends are not imported here)
        known = executors.names()
        if v not in known:
            raise ValueError(one_of([repr(n) for n in known], v))
        return v


class RunSpec(BaseModel):
    """One run: a condition under one revision, one repeat. Immutable once expanded."""

    model_config = ConfigDict(frozen=True)

    experiment: str
    condition: str
    settings: Settings
    repeat: int = 0
    revision: str = "installed"
    order: int = 0

    @property
    def name(self) -> str:
        """Folder and display name: condition, revision when not the default, repeat."""
        parts = [self.condition]
        if self.revision != "installed":
            parts.append(self.revision)
        parts.append(f"r{self.repeat}")
        return "-".join(parts)

    @property
    def key(self) -> str:
        """Stable key of the resolved settings: the same run in any batch has the same key."""
        payload = {
            # how long dstui waits for a run does not change what the run computes
            "settings": self.settings.model_dump(mode="json", exclude=set(SUPERVISION_ONLY)),
            "revision": self.revision,
            "repeat": self.repeat,
        }
        blob = json.dumps(payload, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]
