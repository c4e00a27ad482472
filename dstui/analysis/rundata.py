"""Run records: one MLflow child run as :class:`RunData`, and the few facts read off tags and params.

The lowest room of :mod:`dstui.analysis`: every other module here (fetching,
statistics, parity, grids) builds on these types. No numpy/pandas/mlflow at
module level: ``dstui`` must import fast.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dstui.core.errors import DstuiError
from dstui.core.failures import is_oom
from dstui.core.run_status import CANCELLED_BEFORE_START
from dstui.tracking import metric_names
from dstui.tracking import tags as tag_keys

OUTLIER_FACTOR = 3.0
GB = 1024**3  # GiB: every memory figure is bytes / 2**30

# Statuses that mean "this run produced usable numbers".
USABLE_STATES = frozenset({"done", "running"})
FAILED_STATES = frozenset({"failed", "killed"})
# A run that never started ran nothing: it is listed, never a repeat of its condition.
# queued: not launched yet (a live batch); skipped: never launched (skip_predicted_oom).
NOT_STARTED_STATES = frozenset({"queued", "skipped"})

SUMMARY_PREFIX = "summary."
SYSTEM_PREFIX = "system/"

Progress = Callable[[float, str], None]


# settings a `kind: command` run does not tell dstui (its argv decides them)
COMMAND_UNKNOWN = frozenset({
    "model", "zero_stage", "dtype", "micro_batch", "seq_length", "grad_accum", "offload", "offload_params",
    "compile", "deepcompile", "activation_checkpointing", "dataset", "lr", "sequence_parallel", "sp_mode",
})


class ReportError(DstuiError):
    """Nothing to report on: unknown experiment, batch or runs."""


# -- run records --------------------------------------------------------------


@dataclass
class RunData:
    """One MLflow child run with what a report needs, history included."""

    run_id: str
    run_name: str
    experiment_id: str
    condition: str
    revision: str
    repeat: int
    kind: str
    status: str
    reason: str
    mlflow_status: str
    start_time: int | None
    params: dict[str, str]
    tags: dict[str, str]
    metrics: dict[str, float]
    artifact_uri: str = ""
    label: str = ""  # the condition as grouped (with @revision when several): what tables and charts name
    condition_label: str = ""  # the condition as grouped, without the revision: matched across revisions
    # key -> (steps, values) as numpy arrays, sorted by step
    history: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    # key as ``metrics`` names it -> its name in MLflow (dstui.tracking.metric_names); histories are read by these
    mlflow_keys: dict[str, str] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def oom(self) -> bool:
        return is_oom(self.reason)

    @property
    def usable(self) -> bool:
        """Its steps count: done or running, or a verify run whose FAIL is a verdict (it ran every step)."""
        return self.status in USABLE_STATES or (self.kind == "verify" and self.tags.get(tag_keys.VERDICT) == "FAIL")

    @property
    def started(self) -> bool:
        """The run was launched (whatever became of it): it counts as a repeat of its condition."""
        return self.status not in NOT_STARTED_STATES and not self.reason.startswith(CANCELLED_BEFORE_START)

    @property
    def batch(self) -> str:
        return self.tags.get(tag_keys.BATCH, "")

    @property
    def overlapped(self) -> bool:
        """Another run shared the machine during its timed steps (dstui/execute/overlap.py): its timings are not its own."""
        return self.tags.get(tag_keys.OVERLAPPED, "").strip().lower() == "true"

    @property
    def known_params(self) -> dict[str, str]:
        """Params that describe what really ran: a ``kind: command`` run's training settings are
        dstui's defaults, not what the user's command trained with, so they are left out."""
        if self.kind != "command":
            return self.params
        return {k: v for k, v in self.params.items() if k not in COMMAND_UNKNOWN}

    def param(self, name: str, default: Any = None) -> Any:
        """A param as a Python value (MLflow stores every param as a string)."""
        if name not in self.params:
            return default
        return parse_value(self.params[name])


def parse_value(text: str) -> Any:
    """'3' -> 3, '0.5' -> 0.5, 'True' -> True; anything else stays a string."""
    t = text.strip()
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    try:
        return int(t)
    except ValueError:
        pass
    try:
        return float(t)
    except ValueError:
        return t


_MLFLOW_TO_STATE = {"FINISHED": "done", "FAILED": "failed", "KILLED": "killed", "RUNNING": "running", "SCHEDULED": "queued"}


def _state_of(tags: dict[str, str], mlflow_status: str) -> str:
    state = tags.get(tag_keys.STATUS, "").strip().lower()
    if state:
        # The supervisor writes status.json states; be lenient with synonyms.
        return {"ok": "done", "finished": "done", "success": "done", "error": "failed"}.get(state, state)
    return _MLFLOW_TO_STATE.get(mlflow_status, mlflow_status.lower() or "unknown")


def run_from_mlflow(run: Any) -> RunData:
    """Turn an ``mlflow.entities.Run`` into a :class:`RunData` (no history yet)."""
    tags = dict(run.data.tags)
    params = dict(run.data.params)
    status = _state_of(tags, run.info.status)
    reason = tags.get(tag_keys.REASON, "")
    if not reason and status in FAILED_STATES:
        reason = "no reason recorded"
    repeat_text = tags.get(tag_keys.REPEAT, "0")
    try:
        repeat = int(repeat_text)
    except ValueError:
        repeat = 0
    condition = tags.get(tag_keys.CONDITION) or run.info.run_name or run.info.run_id[:8]
    return RunData(
        run_id=run.info.run_id,
        run_name=run.info.run_name or run.info.run_id[:8],
        experiment_id=run.info.experiment_id,
        condition=condition,
        revision=tags.get(tag_keys.REVISION, "installed") or "installed",
        repeat=repeat,
        kind=tags.get(tag_keys.KIND, "train") or "train",
        status=status,
        reason=reason,
        mlflow_status=run.info.status,
        start_time=run.info.start_time,
        params=params,
        tags=tags,
        metrics=metric_names.metrics_from_mlflow(run.data.metrics),
        artifact_uri=run.info.artifact_uri or "",
        mlflow_keys={metric_names.from_mlflow(k, 0.0)[0]: k for k in sorted(run.data.metrics, key=_old_first)},
    )


def _old_first(key: str) -> bool:
    """Keys MLflow names as records do first, so a run holding both spellings reads the newer one."""
    return metric_names.from_mlflow(key, 0.0)[0] != key


def distinct_tag(runs: Sequence[RunData], key: str) -> list[str]:
    """Distinct non-empty values of a tag, in first-seen order."""
    seen: dict[str, None] = {}
    for r in runs:
        v = r.tags.get(key, "")
        if v:
            seen.setdefault(v, None)
    return list(seen)


_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_name(text: str) -> str:
    """File-name-safe version of a label."""
    return _SAFE.sub("_", text).strip("_") or "x"
