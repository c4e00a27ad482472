"""Build one commit's env and run the condition there, through the ordinary batch + supervisor path.

Each test of a commit is a normal dstui batch (run folders, a detached
supervisor, MLflow runs tagged with the revision's sha), started by the launch
service (:func:`dstui.usecases.launch.start`) and followed by the batch watcher
(:class:`dstui.usecases.watch.BatchWatcher`, with the one takeover rule), so
`dstui status`, the TUI and reports see bisect runs like any other. The batch id
is saved in the commit's record *before* the supervisor starts: a bisect killed
while the batch runs finds it on restart and follows it to the end instead of
running the commit again (the supervisor, in its own session, never stopped).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dstui.bisect.releases import PYPI_PREFIX, is_release_key
from dstui.bisect.store import CommitRecord, Store
from dstui.core import paths, run_status
from dstui.core.errors import DstuiError
from dstui.core.metric_catalogue import first_counted_step, warmup_count
from dstui.core.record_file import read_records
from dstui.core.run_status import RunStatus
from dstui.core.rundir import BatchDir, RunDir
from dstui.revisions import envs
from dstui.revisions.resolved import ResolvedRevision
from dstui.spec.experiment import ExperimentSpec, Revision, RunSpec
from dstui.spec.settings import Settings
from dstui.usecases import launch, watch
from dstui.usecases.options import LaunchOptions

Say = Callable[[str], None]


def _number(v: Any) -> float | None:
    """A finite or non-finite float from a record's value; None for anything else (run output is untrusted)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _check(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's own check (verify, sp-check) from its summary records: verdict, where and why it failed."""
    out: dict[str, Any] = {}
    for r in records:
        if r.get("type") == "summary" and r.get("verdict") in ("PASS", "FAIL"):
            out = {"verdict": r["verdict"], "check": str(r.get("check") or "verify")[:40]}
            step = r.get("first_diverging_step")
            if isinstance(step, int) and not isinstance(step, bool):
                out["first_diverging_step"] = step
            if r.get("reason"):
                out["verdict_reason"] = str(r["reason"])[:300]
    return out


def run_sample(rd: RunDir, batch_id: str) -> dict[str, Any]:
    """One finished run as ``dstui compare`` sees it: post-warm-up mean iteration time, peak, loss curve.

    Warm-up is the condition's ``warmup_steps``, counted as every face counts it
    (:func:`dstui.core.metric_catalogue.first_counted_step`). A run
    whose check FAILed (a verify run exits 1) but trained every step is
    usable: its loss and times are as real as a PASSing run's.
    """
    records = read_records(rd.metrics_file)
    steps = [r for r in records if r.get("type") == "step" and "step" in r]
    warmup = warmup_count(rd.settings().get("warmup_steps")) or 0
    counted = first_counted_step(min((int(r["step"]) for r in steps), default=1), warmup)
    timed = [float(r["iter_time"]) for r in steps if int(r["step"]) >= counted and r.get("iter_time") is not None]
    if not timed:
        timed = [float(r["iter_time"]) for r in steps if r.get("iter_time") is not None]
    peaks = [float(r["mem_peak"]) for r in steps if r.get("mem_peak") is not None]
    st = RunStatus.of(rd)
    check = _check(records)
    complete = bool(steps) and st.steps_total is not None and st.steps_done == st.steps_total
    return {
        "run": rd.name,
        "batch": batch_id,
        "state": st.get("state"),
        "reason": st.reason,
        "mlflow_run_id": st.mlflow_run_id,
        "usable": st.state == run_status.DONE or (check.get("verdict") == "FAIL" and complete),
        "iter_time_mean": statistics.fmean(timed) if timed else None,
        "mem_peak": max(peaks) if peaks else None,
        "loss": {str(int(r["step"])): float(r["loss"]) for r in steps if r.get("loss") is not None},
        **check,
    }


def recorded_series(records: list[dict[str, Any]], metric: str) -> dict[int, float]:
    """``metric`` per step from a run's records: a step field, a ratio ``a/b`` of two, else a summary field (step 0).

    Values that are not numbers are left out; a ratio with a zero denominator too.
    """
    num, _, den = metric.partition("/")
    out: dict[int, float] = {}
    for r in records:
        if r.get("type") != "step" or not isinstance(r.get("step"), int):
            continue
        a = _number(r.get(num))
        b = _number(r.get(den)) if den else 1.0
        if a is not None and b is not None and b != 0:
            out[int(r["step"])] = a / b
    if out or den:
        return out
    for r in records:
        if r.get("type") == "summary" and (v := _number(r.get(num))) is not None:
            out = {0: v}  # the last summary that has it
    return out


def recorded_fields(records: list[dict[str, Any]]) -> list[str]:
    """The numeric fields a run recorded (for the error naming what a metric could have been)."""
    names = {k for r in records if r.get("type") in ("step", "summary") for k, v in r.items()
             if k not in ("time", "step", "type") and _number(v) is not None}  # fmt: skip
    return sorted(names)


@dataclass
class Measurer:
    """Measures commits of one repository under one condition of one spec."""

    spec_path: Path
    spec: ExperimentSpec
    condition: str
    settings: Settings
    repo: Path | None
    store: Store
    say: Say = print
    cache_dir: Path | None = None
    runs_root: Path | None = None
    poll_s: float = 1.0
    on_batch: Callable[[CommitRecord], None] | None = None
    on_build: Callable[[CommitRecord], None] | None = None  # its env is about to be built (or found cached)
    _records: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict, repr=False)

    def revision(self, sha: str) -> Revision:
        """A release (``pypi-<version>``) is its PyPI env; anything else a commit of the repository."""
        if is_release_key(sha):
            return Revision(name=sha, pypi=sha.removeprefix(PYPI_PREFIX))
        if self.repo is None:
            raise DstuiError(f"commit {sha[:12]} needs --repo")
        return Revision(name=sha[:12], git=str(self.repo), ref=sha)

    def records(self, sample: dict[str, Any]) -> list[dict[str, Any]]:
        """A measured run's metrics records, read again from its run folder (kept by dstui like any run)."""
        key = (str(sample.get("batch")), str(sample.get("run")))
        if key not in self._records:
            root = self.runs_root or paths.runs_dir()
            self._records[key] = read_records(RunDir(root / key[0] / key[1]).metrics_file)
        return self._records[key]

    def series(self, rec: CommitRecord, metric: str) -> list[dict[int, float]]:
        """The recorded ``metric`` of each usable run of a commit (runs without it are left out)."""
        found = [recorded_series(self.records(s), metric) for s in rec.samples if s.get("usable")]
        return [f for f in found if f]

    def environment(self, rec: CommitRecord) -> ResolvedRevision | None:
        """The commit's env (built once, then cached); None when it does not build (-> skip)."""
        if rec.build == "failed":
            return None
        rev = self.revision(rec.sha)
        cached = envs.is_cached(rev, cache_dir=self.cache_dir)
        try:
            resolved = envs.resolve(rev, cache_dir=self.cache_dir, progress=self.say)
        except DstuiError as e:  # RevisionBuildError, or not a DeepSpeed tree at this commit
            rec.build, rec.build_error = "failed", str(e)[:4000]  # with the build log's tail
            rec.builds += 0 if cached else 1
            self.store.save(rec)
            return None
        if not cached:
            rec.builds += 1
        rec.build, rec.version = "ok", resolved.version
        self.store.save(rec)
        return resolved

    def follow_unfinished(self, rec: CommitRecord) -> None:
        """Batches recorded but not collected (a bisect killed mid-batch): follow them, then collect."""
        seen = {s["batch"] for s in rec.samples}
        for bid in rec.batches:
            if bid not in seen:
                self.say(f"following batch {bid} of {rec.sha[:12]} (started before a restart)")
                self._wait_and_collect(rec, self._batch(bid))

    def measure(self, rec: CommitRecord, repeats: int) -> None:
        """Make sure the commit has at least ``repeats`` runs (finished or failed)."""
        self.follow_unfinished(rec)
        missing = repeats - rec.runs_done()
        if missing <= 0:
            return
        if self.on_build:
            self.on_build(rec)
        resolved = self.environment(rec)
        if resolved is None:
            return
        runs = [
            RunSpec(experiment=self.spec.name, condition=self.condition, settings=self.settings,
                    repeat=rec.runs_done() + i, revision=resolved.name, order=i)
            for i in range(missing)
        ]  # fmt: skip
        prepared = launch.plan_of(self.spec_path, self.spec, runs, {resolved.name: resolved.to_dict()})

        def created(b: BatchDir) -> None:
            rec.batches.append(b.id)
            self.store.save(rec)  # before the supervisor starts: a restart must find this batch
            if self.on_batch:
                self.on_batch(rec)

        def say(kind: str, text: str) -> None:
            if kind == "note":
                self.say(f"  ! {text}")

        started = launch.start(prepared, LaunchOptions(), runs_root=self.runs_root, on_created=created, say=say)
        self._wait_and_collect(rec, started.batch)

    def _batch(self, bid: str) -> BatchDir:
        root = self.runs_root or paths.runs_dir()
        return BatchDir(root / bid)

    def _wait_and_collect(self, rec: CommitRecord, b: BatchDir) -> None:
        if not b.batch_file.exists():
            self.say(f"batch {b.id} of {rec.sha[:12]} is gone; its runs are run again")
            rec.batches.remove(b.id)
            self.store.save(rec)
            return
        # every state and step of each run said; to the batch's finalization (its samples are read from it);
        # a supervisor that died is replaced by the one takeover rule
        watcher = watch.BatchWatcher(b, poll_s=self.poll_s, key=lambda st: (st.get("state"), st.get("steps_done")),
                                     step_every_s=None, finalize_wait=False)  # fmt: skip
        for ev in watcher.events():
            if isinstance(ev, watch.RunChanged):
                st = ev.status
                reason = f" ({st['reason']})" if st.get("reason") else ""
                self.say(f"  {rec.sha[:12]} {ev.run.name}: {st.get('state')} step {st.get('steps_done', 0)}/"
                         f"{st.get('steps_total', '?')}{reason}")  # fmt: skip
            elif isinstance(ev, watch.Note):
                self.say(f"  ! {ev.text}")
        rec.samples.extend(run_sample(rd, b.id) for rd in b.runs())
        self.store.save(rec)
