"""The batch's MLflow runs: one per batch, one per run and attempt, found again after a crash.

The layout itself (tags, status, what a run that never started looks like) is
:mod:`dstui.tracking.layout`; this module says which of the batch's runs get
which MLflow run, and when. A supervisor that died between creating a run and
saving its id must not make a twin: the batch's run is found by its batch tag,
a run's by its folder and attempt (``dstui.run_dir``, ``dstui.attempt``). A run
carries its identity as tags and its settings and DeepSpeed config as params
(docs/ARCHITECTURE.md, "MLflow layout").

Every attempt's MLflow run ends with the attempt: a run queued again (retry,
resume) lists its earlier attempts in ``status.json``
(:data:`EARLIER_ATTEMPTS`, written by :func:`dstui.execute.batch.reset_run`,
which needs no MLflow); the supervisor ends any of them MLflow still has
RUNNING (:meth:`MlflowRuns.close_earlier`) before the batch may be finalized.
A Slurm job that is requeued is not such an attempt: it keeps its MLflow run
(:mod:`dstui.execute.backends.slurm`, :mod:`dstui.core.attempt_steps`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from dstui.core.run_status import RunStatus
from dstui.core.rundir import RunDir, read_json
from dstui.execute import mlflow_params
from dstui.execute.store import StoreConnection
from dstui.tracking import chart_view, layout
from dstui.tracking import client as tracking
from dstui.tracking import tags as tag_keys

log = logging.getLogger("dstui.execute.supervisor")

EARLIER_ATTEMPTS = "mlflow_to_end"  # status.json: earlier attempts whose MLflow run may still be RUNNING
REFUSALS = ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "INVALID_STATE")


def refused(e: Exception) -> bool:
    """The store answered and said no (the run was deleted in MLflow's UI, say): trying again never helps.

    Anything else (unreachable, locked) is the store being down, and is tried again later.
    """
    return getattr(e, "error_code", None) in REFUSALS


def earlier_attempt(rd: RunDir, old: dict[str, Any]) -> dict[str, Any]:
    """The :data:`EARLIER_ATTEMPTS` entry of a run's attempt that ended (``old``: its status)."""
    return {"run_dir": str(rd.path), "attempt": old.get("attempt") or 1, "state": old.get("state"),
            "reason": old.get("reason"), "ended": old.get("ended")}  # fmt: skip


def start_of(st: dict[str, Any]) -> float | None:
    """When an attempt's MLflow run starts: its launch; one that never started starts (and ends) where it ended."""
    return RunStatus.from_dict(st).began


class MlflowRuns(StoreConnection):
    """Creates (or finds) the parent and child runs; every method returns None while the store is down."""

    def parent_run_id(self) -> str | None:
        """The batch's MLflow run (made with the experiment's description and dstui view the first time)."""
        pid = self.info.get("mlflow_parent_run_id")
        if pid:
            return pid
        c = self.client()
        if c is None:
            return None
        try:
            found = layout.find_batch(c, self.experiment_id, self.batch.id)
            pid = found.info.run_id if found else self._create_batch_run(c)
            self.info = self.batch.update_info(mlflow_parent_run_id=pid)
            return pid
        except Exception as e:
            self.down(e)
            return None

    def _create_batch_run(self, c: Any) -> str:
        spec = self.info.get("spec") or {}
        run = layout.BatchRun(batch=self.batch.id, runs=len(self.info.get("runs", [])), spec=str(self.info.get("spec_path") or ""),
                              description=batch_note(self.info, self.experiment_id))  # fmt: skip
        pid = layout.open_batch(c, self.experiment_id, run, params=batch_params(spec), start_s=self.info.get("created"))
        chart_view.describe(c, self.experiment_id, description=str(spec.get("description") or ""),
                            axes=chart_view.varied_settings(spec))  # fmt: skip
        return pid

    def child_run_id(self, rd: RunDir) -> str | None:
        st = rd.status()
        if st.get("mlflow_run_id"):
            return st["mlflow_run_id"]
        parent = self.parent_run_id()  # the batch's run first: the run's description links to it
        c = self.client()
        if c is None or parent is None:
            return None
        try:
            # the folder plus the attempt identifies this run, so a supervisor that died
            # between creating it and saving its id finds it again instead of making a twin
            found = layout.find_child(c, self.experiment_id, str(rd.path), st.get("attempt"))
            rid = found.info.run_id if found else self._create_child(c, rd, st, parent)
            rd.update_status(mlflow_run_id=rid)
            return rid
        except Exception as e:
            self.down(e)
            return None

    def _label_index(self, spec: dict) -> int:
        """Where this run's condition (and revision) first comes among the batch's runs: its colour.

        Repeats share their condition's colour; a batch of up to ten conditions gets ten colours.
        """
        names = tuple(self.info.get("runs", []))
        cached = getattr(self, "_labels", None)
        if cached is None or cached[0] != names:  # once per batch layout, not once per child
            labels: list[tuple[Any, Any]] = []
            for name in names:
                other = RunDir(self.batch.path / name).spec()
                label = (other.get("condition"), other.get("revision"))
                if label not in labels:
                    labels.append(label)
            self._labels = cached = (names, labels)
        labels = cached[1]
        mine = (spec.get("condition"), spec.get("revision"))
        return labels.index(mine) if mine in labels else len(labels)

    def _create_child(self, c: Any, rd: RunDir, st: dict, parent: str) -> str:
        spec = rd.spec()
        settings = rd.settings()
        extra: dict[str, Any] = {tag_keys.ORDER: spec.get("order"), tag_keys.RUN_KEY: spec.get("key")}
        rev = spec.get("revision_info") or {}
        if rev:
            from dstui.revisions.resolved import ResolvedRevision

            extra.update(ResolvedRevision.from_dict(rev).mlflow_tags())
        run = layout.ChildRun(
            name=rd.name, batch=self.batch.id, condition=spec.get("condition"), revision=spec.get("revision"),
            repeat=spec.get("repeat"), kind=settings.get("kind") or "train", state=st.get("state"),
            source=source_of(settings), description=run_note(rd.name, spec, self.batch.id, self.experiment_id, parent),
            color=self._label_index(spec), run_dir=str(rd.path), attempt=st.get("attempt"), extra=extra,
        )  # fmt: skip
        params = mlflow_params.settings_params(settings, read_json(rd.ds_config_file, {}) or {})
        if spec.get("revision") not in (None, "installed"):
            params["revision"] = spec["revision"]
        rid = layout.open_child(c, self.experiment_id, run, params=params, start_s=start_of(st))
        if rev.get("diff_path") and Path(rev["diff_path"]).is_file():
            # a working-tree revision: the uncommitted changes it ran with
            c.log_artifact(rid, rev["diff_path"], artifact_path="revision")
        layout.log_dataset(c, rid, settings)
        return rid

    def close_earlier(self, rd: RunDir) -> bool:
        """End the MLflow runs of this run's earlier attempts that are still RUNNING; True when none is left.

        An attempt's run is found by its folder and attempt; one MLflow never
        saw (the store was down, or was replaced) has nothing to end.
        """
        pending = list(rd.status().get(EARLIER_ATTEMPTS) or [])
        if not pending:
            return True
        c = self.client()
        if c is None:
            return False
        ended = []
        for entry in pending:
            try:
                found = self._earlier_run(c, entry)
                if found is not None and found.info.status in layout.OPEN_STATES:
                    state = entry.get("state") or "failed"
                    layout.end_run(c, found.info.run_id, state, ended_s=entry.get("ended"),
                                   tags={tag_keys.REASON: entry.get("reason") or ""})  # fmt: skip
            except Exception as e:
                if not refused(e):
                    self.down(e)
                    break
                log.warning("%s: MLflow refused to end an earlier attempt's run (%s); leaving it", rd.name, e)
            ended.append(entry)
        if not ended:
            return False
        # read again: a retry may have added an attempt meanwhile, and it must not be lost
        left = [e for e in rd.status().get(EARLIER_ATTEMPTS) or [] if e not in ended]
        rd.update_status(**{EARLIER_ATTEMPTS: left})
        return not left

    def _earlier_run(self, c: Any, entry: dict[str, Any]) -> Any | None:
        if entry.get("ref"):  # listed before attempts had their own tag: "<folder>#<attempt>"
            return tracking.find_run(c, self.experiment_id, {tag_keys.RUN_DIR: entry["ref"]})
        return layout.find_child(c, self.experiment_id, str(entry.get("run_dir")), entry.get("attempt"))

    def reopen_parent(self) -> None:
        """A finalized batch that runs again (retry, resume): its batch run is RUNNING again until it ends."""
        c = self.client()
        pid = self.parent_run_id()
        if c is None or pid is None:
            return
        try:
            layout.reopen(c, pid)
        except Exception as e:
            self.down(e)

    def tag(self, rd: RunDir, values: dict[str, Any]) -> None:
        """Tags on a run's MLflow child now (live state); a store that is down only loses this copy."""
        c = self.client()
        rid = self.child_run_id(rd)
        if c is None or rid is None:
            return
        try:
            tracking.set_tags(c, rid, values)
        except Exception as e:
            self.down(e)


def source_of(settings: dict[str, Any]) -> str:
    """What the run ran, for ``mlflow.source.name``: the bundled runner, or the command's program."""
    kind = settings.get("kind") or "train"
    if kind == "command":
        argv = settings.get("command") or ["?"]
        return Path(str(argv[0])).name if argv[0] != "{python}" else "python"
    return "runners/compare_loss.py" if kind == "verify" else "runners/train.py"


def run_note(name: str, spec: dict[str, Any], batch: str, experiment_id: str | None, parent_id: str) -> str:
    """A run's MLflow description: what it is, and a link to its batch's run."""
    link = f"#/experiments/{experiment_id}/runs/{parent_id}?{tracking.UI_MODE}" if experiment_id else ""
    batch_ref = f"[{batch}]({link})" if link else f"`{batch}`"
    return (f"Run `{name}` of batch {batch_ref}: condition `{spec.get('condition')}`, "
            f"revision `{spec.get('revision')}`, repeat {spec.get('repeat')}.")  # fmt: skip


def batch_note(info: dict[str, Any], experiment_id: str | None = None) -> str:
    """The batch run's MLflow description: the spec's own description, then what the batch is, where
    its runs' charts are (the experiment's dstui view, filtered to this batch) and where the report goes."""
    spec = info.get("spec") or {}
    lines = [str(spec.get("description") or "").strip()]
    lines.append(f"{layout.batch_description_lead(info.get('id', ''))} `{info.get('spec_path', '')}`: {len(info.get('runs', []))} runs.")
    for axis, values in (spec.get("axes") or {}).items():
        lines.append(f"- axis `{axis}`: {', '.join(json.dumps(v) for v in values)}")
    if spec.get("baseline"):
        lines.append(f"- baseline: `{spec['baseline']}`")
    if experiment_id:
        lines.append(f"\nIts runs' charts: [the batch's runs]({batch_runs_link(experiment_id, str(info.get('id', '')))}), "
                     f"[every run of the experiment]({chart_view.view_url('', experiment_id)}) (the **dstui** view).")
    lines.append("\n`dstui report` adds the report: `report.html` in this run's artifacts.")
    return "\n".join(line for line in lines if line)[: layout.DESCRIPTION_MAX]


def batch_runs_link(experiment_id: str, batch: str) -> str:
    """The experiment's chart view of one batch's runs (a search filter in the link; MLflow's own chart layout)."""
    from urllib.parse import quote

    filt = f"{tag_keys.RUN_FILTER} and {tag_keys.search(tag_keys.BATCH)} = {tracking.literal(batch) or repr(batch)}"
    return f"#/experiments/{experiment_id}/runs?searchFilter={quote(filt)}&compareRunsMode=CHART&{tracking.UI_MODE}"


def batch_params(spec: dict[str, Any]) -> dict[str, str]:
    """The batch run's params: the batch's axes, baseline, repeats and revisions (none empty)."""
    out: dict[str, Any] = {f"axis.{k}": v for k, v in (spec.get("axes") or {}).items()}
    out["baseline"] = spec.get("baseline")
    out["conditions"] = [c.get("name") for c in spec.get("conditions") or [] if isinstance(c, dict)]
    out["repeats"] = spec.get("repeats")
    out["revisions"] = [r.get("name") for r in spec.get("revisions") or [] if isinstance(r, dict)]
    return {k: mlflow_params.text(v) for k, v in out.items() if not mlflow_params.empty(v)}
