"""dstui's MLflow layout, written in one place: a run per batch, a run per RunSpec, their tags and end.

The supervisor (:mod:`dstui.execute.mlflow_runs`, :mod:`dstui.execute.sink`),
the importer (:mod:`dstui.importer.seedlogs`) and anything else that logs
batches (``dstui tune``: a batch run and a run per probe) open, tag and end
their MLflow runs through these functions, so MLflow shows the same layout
whoever wrote it (docs/ARCHITECTURE.md, "MLflow layout"):

* a **batch run** (``dstui.role=batch``): the batch's description, axes and
  counts; it holds no metrics;
* a **run** per RunSpec (``dstui.role=run``): its identity as tags, its
  settings as params (computed by the caller), its points through
  :func:`log_points` (MLflow's names and units: :mod:`~dstui.tracking.metric_names`),
  and a dataset input where it read one.

Runs are not nested under their batch's run (no ``mlflow.parentRunId``):
MLflow's UI fetches the parent of every nested run it lists and makes it a row,
and every visible row is a trace in every line chart, so the batch run sat in
each chart's legend with no data; and while collapsed, it hid its runs from the
chart view altogether. ``dstui.batch`` ties a run to its batch instead, and the
experiment's "dstui" view (:mod:`~dstui.tracking.chart_view`) lists the runs
only. Readers still understand nested records.

A batch of one's own (``dstui tune``: a batch run, a run per probe)::

    c = tracking.client(uri)
    exp = chart_view.set_up(c, "tune-llama", description="...", axes=["micro_batch", "zero_stage"])
    batch = layout.open_batch(c, exp, layout.BatchRun(batch=tune_id, runs=len(probes), description="..."))
    rid = layout.open_child(c, exp, layout.ChildRun(name="mb4-z2", batch=tune_id, condition="mb4-z2",
                            kind="train", color=i), params=settings, start_s=started)
    layout.log_points(c, rid, [("iter_time", 0.21, ts_ms, step), ("mem_peak", 3.2e9, ts_ms, step)])
    layout.end_run(c, rid, "done", ended_s=ended, tags={tag_keys.REASON: ""})
    layout.end_batch(c, batch, ["done", "failed", ...])

Ends are never before starts: :func:`end_run` ends a run no earlier than MLflow
has it starting, and a run that never started (cancelled before start, skipped)
is opened at the moment it ended, so MLflow shows it KILLED with no duration.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import platform
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dstui.core.rundir import FINAL_STATES
from dstui.tracking import client as tracking
from dstui.tracking import metric_names
from dstui.tracking import tags as tag_keys

if TYPE_CHECKING:  # pragma: no cover
    from mlflow import MlflowClient

# a run's dstui state -> MLflow's status (its icon); a run that never started was killed, not failed
MLFLOW_STATUS = {"done": "FINISHED", "failed": "FAILED", "killed": "KILLED", "skipped": "KILLED"}
OPEN_STATES = ("RUNNING", "SCHEDULED")
SOURCE_TYPE = "LOCAL"  # MLflow's SourceType for a program started on this machine
DESCRIPTION_MAX = 5000  # MLflow keeps tag values up to 8000 characters; a long description is cut
# matplotlib's tab10, the report's palette too: ten colours a reader tells apart
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
# the tags every run of the layout has from the moment it exists (the rest come as the run goes)
RUN_TAGS = (tag_keys.ROLE, tag_keys.BATCH, tag_keys.CONDITION, tag_keys.REVISION, tag_keys.REPEAT, tag_keys.KIND,
            tag_keys.STATUS, tag_keys.DESCRIPTION, tag_keys.RUN_COLOR, tag_keys.SOURCE_NAME, tag_keys.SOURCE_TYPE,
            tag_keys.version("dstui"), tag_keys.version("python"))  # fmt: skip
BATCH_TAGS = (tag_keys.ROLE, tag_keys.BATCH, tag_keys.RUNS, tag_keys.SPEC, tag_keys.DESCRIPTION,
              tag_keys.HOSTNAME, tag_keys.version("dstui"), tag_keys.version("python"))  # fmt: skip


@dataclass
class BatchRun:
    """What a batch's MLflow run says about the batch."""

    batch: str
    runs: int
    description: str = ""
    spec: str = ""  # the spec's path ('' for an import)
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. dstui.imported_from

    def tags(self) -> dict[str, str]:
        return _clean({
            tag_keys.ROLE: tag_keys.ROLE_BATCH,
            tag_keys.BATCH: self.batch,
            tag_keys.RUNS: self.runs,
            tag_keys.SPEC: self.spec,
            tag_keys.DESCRIPTION: self.description[:DESCRIPTION_MAX],
            **host_tags(),
            **standard_tags(self.spec or None),
            **self.extra,
        })


@dataclass
class ChildRun:
    """What one run's MLflow run says about itself when it is opened (its end comes with :func:`end_run`)."""

    name: str
    batch: str
    condition: str
    revision: str = "installed"
    repeat: int = 0
    kind: str = "train"
    state: str = "running"
    source: str = ""  # what ran: runners/train.py, a command's program, the imported log
    description: str = ""
    color: int = 0  # the condition's place in the batch: runs of one condition share a colour
    run_dir: str = ""  # the run folder, with attempt: how a supervisor finds the run again
    attempt: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # order, run key, revision, imported_from, ...

    def tags(self) -> dict[str, str]:
        out: dict[str, Any] = {
            tag_keys.ROLE: tag_keys.ROLE_RUN,
            tag_keys.BATCH: self.batch,
            tag_keys.CONDITION: self.condition,
            tag_keys.REVISION: self.revision,
            tag_keys.REPEAT: self.repeat,
            tag_keys.KIND: self.kind,
            tag_keys.STATUS: self.state,
            tag_keys.DESCRIPTION: self.description[:DESCRIPTION_MAX],
            tag_keys.RUN_COLOR: PALETTE[self.color % len(PALETTE)],
            **host_tags(),
            **standard_tags(self.source or None),
            **self.extra,
        }
        if self.run_dir:
            out[tag_keys.RUN_DIR] = self.run_dir
            out[tag_keys.ATTEMPT] = self.attempt or 1
        return _clean(out)


def _clean(tags: dict[str, Any]) -> dict[str, str]:
    """Tag values as MLflow stores them: text (JSON for other values), none longer than it keeps; None: no tag
    (``extra={tag_keys.HOSTNAME: None}`` leaves out the host where it is not known)."""
    return {k: tracking.value_text(v)[:DESCRIPTION_MAX] for k, v in tags.items() if v is not None}


def open_batch(c: MlflowClient, experiment_id: str, run: BatchRun, *, params: dict[str, Any] | None = None,
               start_s: float | None = None) -> str:  # fmt: skip
    """The batch's MLflow run, RUNNING from ``start_s`` (the batch's creation) until :func:`end_batch`."""
    rid = tracking.create_run(c, experiment_id, run.batch, tags=run.tags(), start_time=start_s)
    if params:
        tracking.log_params(c, rid, params)
    return rid


def open_child(c: MlflowClient, experiment_id: str, run: ChildRun, *, params: dict[str, Any] | None = None,
               start_s: float | None = None) -> str:  # fmt: skip
    """One run's MLflow run from ``start_s`` (its launch: a run opened late keeps its own start; one that
    never started opens at its end). ``params``: its settings, none empty."""
    rid = tracking.create_run(c, experiment_id, run.name[:250], tags=run.tags(), start_time=start_s or time.time())
    if params:
        tracking.log_params(c, rid, params)
    return rid


def find_batch(c: MlflowClient, experiment_id: str, batch: str) -> Any | None:
    return tracking.find_run(c, experiment_id, {tag_keys.BATCH: batch, tag_keys.ROLE: tag_keys.ROLE_BATCH})


def find_child(c: MlflowClient, experiment_id: str, run_dir: str, attempt: int | None) -> Any | None:
    """The run of one attempt of a run folder; also as records before ``dstui.attempt`` tagged it
    (``dstui.run_dir`` = ``<folder>#<attempt>``)."""
    n = attempt or 1
    found = tracking.find_run(c, experiment_id, {tag_keys.RUN_DIR: run_dir, tag_keys.ATTEMPT: n})
    return found or tracking.find_run(c, experiment_id, {tag_keys.RUN_DIR: f"{run_dir}#{n}"})


def end_run(c: MlflowClient, run_id: str, state: str, *, ended_s: float | None = None,
            tags: dict[str, Any] | None = None) -> None:  # fmt: skip
    """Final tags, then MLflow's status for ``state`` at ``ended_s`` (the job's exit), never before the run's start."""
    final = {tag_keys.STATUS: state, **(tags or {})}
    tracking.set_tags(c, run_id, final)
    end_ms = int((ended_s or time.time()) * 1000)
    start_ms = c.get_run(run_id).info.start_time
    c.set_terminated(run_id, status=MLFLOW_STATUS.get(state, "FAILED"), end_time=max(end_ms, start_ms or 0))


def batch_status(states: Iterable[str]) -> str:
    """The batch run's MLflow status: FINISHED when every run is done (or skipped), FAILED when one failed,
    KILLED when runs were cancelled and none failed."""
    states = list(states)
    if all(s in ("done", "skipped") for s in states):
        return "FINISHED"
    return "FAILED" if "failed" in states else "KILLED"


def end_batch(c: MlflowClient, run_id: str, states: list[str], *, tags: dict[str, Any] | None = None) -> None:
    """The batch run's counts (``dstui.runs_<state>``) and end."""
    counts = {tag_keys.runs_in(s): states.count(s) for s in (*FINAL_STATES, *sorted(set(states) - set(FINAL_STATES)))}
    tracking.set_tags(c, run_id, {**counts, **(tags or {})})
    tracking.finish(c, run_id, batch_status(states))


def reopen(c: MlflowClient, run_id: str) -> None:
    """A run that ended is RUNNING again (a batch run whose batch runs again: retry, resume)."""
    if c.get_run(run_id).info.status not in OPEN_STATES:
        c.update_run(run_id, status="RUNNING")


def log_points(c: MlflowClient, run_id: str, points: Iterable[metric_names.Point]) -> int:
    """A run's (key, value, timestamp ms, step) points under MLflow's names and units; returns the count."""
    return tracking.log_metrics(c, run_id, metric_names.points_to_mlflow(points))


def batch_description_lead(batch_id: str) -> str:
    """How dstui's own part of a batch run's description begins (after the spec's description), so that
    the report can take the spec's description back out of it (dstui.execute.mlflow_runs.batch_note)."""
    return f"Batch `{batch_id}` of spec"


def standard_tags(source: str | None) -> dict[str, str]:
    """MLflow's own tags: who ran it (``mlflow.user``) and what (``mlflow.source.name``/``.type``)."""
    tags: dict[str, str] = {}
    with contextlib.suppress(Exception):  # no user name in a bare container
        tags[tag_keys.USER] = getpass.getuser()
    if source:
        tags[tag_keys.SOURCE_NAME] = source
        tags[tag_keys.SOURCE_TYPE] = SOURCE_TYPE
    return tags


def host_tags() -> dict[str, str]:
    """Where this process runs: dstui's and Python's versions, the host's name."""
    import dstui

    return {
        tag_keys.version("dstui"): dstui.__version__,
        tag_keys.version("python"): platform.python_version(),
        tag_keys.HOSTNAME: platform.node(),
    }


def versions_tags(header: dict[str, Any]) -> dict[str, Any]:
    """Tags from a runner's header record: versions and hardware."""
    tags: dict[str, Any] = {}
    for name, version in (header.get("versions") or {}).items():
        tags[tag_keys.version(name)] = version
    for key in ("hostname", "device", "gpu_name", "gpu_count", "world_size", "deepspeed_git_sha"):
        if header.get(key) is not None:
            tags[tag_keys.of(key)] = header[key]
    return tags


# -- the dataset a run read ------------------------------------------------------------------

BUNDLED = {"tiny-corpus": ("local", {"uri": "configs/data/tiny-corpus.txt"}), "synthetic": ("code", {"generator": "seeded random tokens"})}


def dataset_of(settings: dict[str, Any]) -> dict[str, str] | None:
    """MLflow's dataset fields for what a train run read (its ``dataset`` setting), or None: a ``kind:
    command`` run does not tell, a verify run reads no dataset (runners/compare_loss.py makes its batches),
    and a log without the setting does not say.

    The digest is of what identifies the data a run saw (the dataset, its config, the share used,
    the sequence length), so runs that read the same tokens share one dataset in MLflow's UI.
    """
    name = settings.get("dataset")
    if not name or settings.get("kind", "train") != "train":
        return None
    name = str(name)
    config = settings.get("dataset_config")
    source_type, source = BUNDLED.get(name, ("hugging_face", {"path": name, "config_name": config}))
    profile = {k: settings.get(k) for k in ("dataset_percent", "seq_length") if settings.get(k) is not None}
    ident = json.dumps([name, config, profile], sort_keys=True, default=str)
    return {
        "name": name if not config else f"{name}/{config}",
        "digest": hashlib.sha256(ident.encode()).hexdigest()[:8],
        "source_type": source_type,
        "source": json.dumps(source, default=str),
        "profile": json.dumps(profile, default=str),
    }


def log_dataset(c: MlflowClient, run_id: str, settings: dict[str, Any]) -> str | None:
    """Log the run's dataset as an MLflow dataset input ("training" context); its name, or None."""
    fields = dataset_of(settings)
    if fields is None:
        return None
    from mlflow.entities import Dataset, DatasetInput, InputTag

    ds = DatasetInput(Dataset(**fields), tags=[InputTag(tag_keys.DATASET_CONTEXT, "training")])
    c.log_inputs(run_id, datasets=[ds])
    tracking.set_tags(c, run_id, {tag_keys.DATASET: fields["name"]})
    return fields["name"]
