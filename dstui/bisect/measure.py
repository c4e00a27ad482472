"""Build one commit's env and run the condition there, through the ordinary batch + supervisor path.

Each test of a commit is a normal dstui batch (run folders, a detached
supervisor, MLflow runs tagged with the revision's sha), so `dstui status`,
the TUI and reports see bisect runs like any other. The batch id is saved in
the commit's record *before* the supervisor starts: a bisect killed while the
batch runs finds it on restart and follows it to the end instead of running
the commit again (the supervisor, in its own session, never stopped).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dstui.bisect.store import CommitRecord, Store
from dstui.core import paths
from dstui.core.errors import DstuiError
from dstui.core.records import read_records
from dstui.core.rundir import FINAL_STATES, BatchDir, RunDir
from dstui.execute import batch as batch_mod
from dstui.execute import supervisor
from dstui.revisions import envs
from dstui.spec import dsconfig
from dstui.spec.models import ExperimentSpec, Revision, RunSpec, Settings

Say = Callable[[str], None]


def run_sample(rd: RunDir, batch_id: str) -> dict[str, Any]:
    """One finished run as ``dstui compare`` sees it: post-warm-up mean iteration time, peak, loss curve.

    Warm-up is the condition's ``warmup_steps`` counted from the first logged
    step, the rule of :func:`dstui.analysis.runs.post_warmup_mask`.
    """
    steps = [r for r in read_records(rd.metrics_file) if r.get("type") == "step" and "step" in r]
    warmup = int(rd.settings().get("warmup_steps", 0))
    first = min((int(r["step"]) for r in steps), default=1)
    timed = [float(r["iter_time"]) for r in steps if int(r["step"]) >= first + warmup and r.get("iter_time") is not None]
    if not timed:
        timed = [float(r["iter_time"]) for r in steps if r.get("iter_time") is not None]
    peaks = [float(r["mem_peak"]) for r in steps if r.get("mem_peak") is not None]
    st = rd.status()
    return {
        "run": rd.name,
        "batch": batch_id,
        "state": st.get("state"),
        "reason": st.get("reason"),
        "mlflow_run_id": st.get("mlflow_run_id"),
        "usable": st.get("state") == "done",
        "iter_time_mean": statistics.fmean(timed) if timed else None,
        "mem_peak": max(peaks) if peaks else None,
        "loss": {str(int(r["step"])): float(r["loss"]) for r in steps if r.get("loss") is not None},
    }


@dataclass
class Measurer:
    """Measures commits of one repository under one condition of one spec."""

    spec_path: Path
    spec: ExperimentSpec
    condition: str
    settings: Settings
    repo: Path
    store: Store
    say: Say = print
    cache_dir: Path | None = None
    runs_root: Path | None = None
    poll_s: float = 1.0
    on_batch: Callable[[CommitRecord], None] | None = None

    def revision(self, sha: str) -> Revision:
        return Revision(name=sha[:12], git=str(self.repo), ref=sha)

    def environment(self, rec: CommitRecord) -> envs.ResolvedRevision | None:
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
        resolved = self.environment(rec)
        if resolved is None:
            return
        runs = [
            RunSpec(experiment=self.spec.name, condition=self.condition, settings=self.settings,
                    repeat=rec.runs_done() + i, revision=resolved.name, order=i)
            for i in range(missing)
        ]  # fmt: skip
        configs = {r.name: dsconfig.build(r, spec_dir=self.spec_path.parent, file=str(self.spec_path)) for r in runs}
        plan = batch_mod.Plan(self.spec_path, self.spec, runs, configs, {resolved.name: resolved.to_dict()})
        b = batch_mod.create(plan, runs_root=self.runs_root)
        rec.batches.append(b.id)
        self.store.save(rec)  # before the supervisor starts: a restart must find this batch
        if self.on_batch:
            self.on_batch(rec)
        supervisor.spawn(b)
        self._wait_and_collect(rec, b)

    def _batch(self, bid: str) -> BatchDir:
        root = self.runs_root or paths.runs_dir()
        return BatchDir(root / bid)

    def _wait_and_collect(self, rec: CommitRecord, b: BatchDir) -> None:
        if not b.batch_file.exists():
            self.say(f"batch {b.id} of {rec.sha[:12]} is gone; its runs are run again")
            rec.batches.remove(b.id)
            self.store.save(rec)
            return
        shown: dict[str, tuple] = {}
        while True:
            runs = b.runs()
            for rd in runs:
                st = rd.status()
                key = (st.get("state"), st.get("steps_done"))
                if shown.get(rd.name) != key:
                    shown[rd.name] = key
                    reason = f" ({st['reason']})" if st.get("reason") else ""
                    self.say(f"  {rec.sha[:12]} {rd.name}: {st.get('state')} step {st.get('steps_done', 0)}/"
                             f"{st.get('steps_total', '?')}{reason}")  # fmt: skip
            if runs and all(rd.state in FINAL_STATES for rd in runs) and b.info().get("finalized"):
                break
            supervisor.ensure_supervised(b)  # taken over if its supervisor died
            time.sleep(self.poll_s)
        rec.samples.extend(run_sample(rd, b.id) for rd in b.runs())
        self.store.save(rec)
