"""Figures for reports, computed from what MLflow holds.

Everything a report shows is computed here, from MLflow runs laid out as
``docs/ARCHITECTURE.md`` describes (child runs tagged ``dstui.role=run``), so
that live, old, imported and team-server runs are treated alike. Charts
(:mod:`dstui.report.charts`) and markdown (:mod:`dstui.report.markdown`) only format these
numbers; the tests check them against figures computed independently.

Definitions (the report repeats them so a reader does not have to guess):

* a *step* is one optimizer step (``grad_accum`` micro-batches);
* per-run statistics exclude the first ``warmup_steps`` optimizer steps
  (param ``warmup_steps``), because the first steps include compilation,
  allocator growth and NCCL set-up;
* a condition's iteration time is the mean over the post-warm-up iterations
  of all its usable repeats, its error bar the sample standard deviation
  (n-1) of those same iterations;
* an iteration is an *outlier* when it takes more than ``OUTLIER_FACTOR``
  times the median post-warm-up iteration of its run;
* loss parity compares per-step mean losses (mean over repeats) on the steps
  both conditions logged, warm-up included (loss is deterministic from step
  one): PASS when the largest absolute difference is within the tolerance.

pandas and mlflow are imported inside functions: ``dstui`` must import fast.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dstui.core.errors import DstuiError
from dstui.core.failures import is_oom
from dstui.tracking import client as tracking

if TYPE_CHECKING:  # pragma: no cover
    pass

OUTLIER_FACTOR = 3.0
GB = 1024**3

# Statuses that mean "this run produced usable numbers".
USABLE_STATES = frozenset({"done", "running"})
FAILED_STATES = frozenset({"failed", "killed"})

# Step metrics a report reads; anything else (lr, custom keys) is still
# fetched and exported in data.json, but these drive the figures.
KNOWN_STEP_KEYS = ("loss", "iter_time", "tokens_per_s", "tflops_per_gpu", "mfu", "mem_alloc", "mem_peak")
SUMMARY_PREFIX = "summary."
SYSTEM_PREFIX = "system/"

Progress = Callable[[float, str], None]


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
    label: str = ""
    # key -> (steps, values) as numpy arrays, sorted by step
    history: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def oom(self) -> bool:
        return is_oom(self.reason)

    @property
    def usable(self) -> bool:
        return self.status in USABLE_STATES

    @property
    def batch(self) -> str:
        return self.tags.get("dstui.batch", "")

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
    state = tags.get("dstui.status", "").strip().lower()
    if state:
        # The supervisor writes status.json states; be lenient with synonyms.
        return {"ok": "done", "finished": "done", "success": "done", "error": "failed"}.get(state, state)
    return _MLFLOW_TO_STATE.get(mlflow_status, mlflow_status.lower() or "unknown")


def run_from_mlflow(run: Any) -> RunData:
    """Turn an ``mlflow.entities.Run`` into a :class:`RunData` (no history yet)."""
    tags = dict(run.data.tags)
    params = dict(run.data.params)
    status = _state_of(tags, run.info.status)
    reason = tags.get("dstui.reason", "")
    if not reason and status in FAILED_STATES:
        reason = "no reason recorded"
    repeat_text = tags.get("dstui.repeat", "0")
    try:
        repeat = int(repeat_text)
    except ValueError:
        repeat = 0
    condition = tags.get("dstui.condition") or run.info.run_name or run.info.run_id[:8]
    return RunData(
        run_id=run.info.run_id,
        run_name=run.info.run_name or run.info.run_id[:8],
        experiment_id=run.info.experiment_id,
        condition=condition,
        revision=tags.get("dstui.revision", "installed") or "installed",
        repeat=repeat,
        kind=tags.get("dstui.kind", "train") or "train",
        status=status,
        reason=reason,
        mlflow_status=run.info.status,
        start_time=run.info.start_time,
        params=params,
        tags=tags,
        metrics=dict(run.data.metrics),
        artifact_uri=run.info.artifact_uri or "",
    )


# -- fetching from MLflow -----------------------------------------------------


def fetch_runs(
    client: Any,
    experiment: str,
    *,
    batch: str | None = None,
    run_ids: Sequence[str] | None = None,
) -> tuple[Any, list[RunData]]:
    """The experiment and its dstui child runs (optionally one batch or given ids).

    Explicit ``run_ids`` are taken as they are (they need not carry the role
    tag, so hand-made runs can be compared too); otherwise runs tagged
    ``dstui.role='run'`` are searched, paging through all of them.
    """
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ReportError(f"no MLflow experiment named '{experiment}'")
    runs: list[Any] = []
    if run_ids:
        for rid in run_ids:
            try:
                runs.append(client.get_run(rid))
            except Exception as e:  # MlflowException: unknown id
                raise ReportError(f"no MLflow run '{rid}': {e}") from None
    else:
        filt = "tags.`dstui.role` = 'run'"
        if batch:
            lit = tracking.literal(batch)
            if lit is None:
                raise ReportError(f"batch id {batch!r} holds both kinds of quote; MLflow cannot filter on it")
            filt += f" and tags.`dstui.batch` = {lit}"
        token = None
        while True:
            page = client.search_runs(
                [exp.experiment_id], filter_string=filt, max_results=1000, page_token=token
            )
            runs.extend(page)
            token = getattr(page, "token", None)
            if not token:
                break
    if not runs:
        what = f"batch '{batch}'" if batch else f"experiment '{experiment}'"
        raise ReportError(f"no dstui runs in {what} (child runs tagged dstui.role=run)")
    data = [run_from_mlflow(r) for r in runs]
    data.sort(key=lambda r: (r.batch, _order_of(r), r.start_time or 0, r.run_name))
    return exp, data


def _order_of(run: RunData) -> int:
    """Launch order when recorded (tag dstui.order), else repeat: keeps conditions in spec order."""
    try:
        return int(run.tags.get("dstui.order", ""))
    except ValueError:
        return run.repeat


def find_batch_parent(client: Any, experiment_id: str, batch: str) -> Any | None:
    """The batch's parent run (tags dstui.role=batch, dstui.batch=ID), if any."""
    return tracking.find_run(client, experiment_id, {"dstui.role": "batch", "dstui.batch": batch})


_DB_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")


def fetch_histories(
    client: Any,
    tracking_uri: str,
    runs: Sequence[RunData],
    *,
    progress: Progress | None = None,
) -> str:
    """Fill ``run.history`` for every run; returns the method used.

    MLflow's ``get_metric_history`` builds one ORM object per value (about
    30 us each here), which for 50 runs x 10,000 steps x 6 metrics is over a
    minute. When the tracking store is a database, one plain SELECT over
    MLflow's ``metrics`` table through SQLAlchemy reads the same rows at about
    1 us each. Any failure there (an unexpected schema, a server URI) falls
    back to the public API, so results never depend on the fast path.
    """
    if not runs:
        return "none"
    scheme = tracking_uri.split(":", 1)[0].split("+", 1)[0].lower()
    if scheme == "sqlite":
        try:
            _histories_sqlite(tracking_uri, runs)
            return "sqlite"
        except Exception:  # noqa: BLE001 - any problem: try the generic paths
            pass
    if scheme in _DB_SCHEMES:
        try:
            _histories_sql(tracking_uri, runs)
            return "sql"
        except Exception:  # noqa: BLE001 - any problem: use the public API instead
            pass
    _histories_api(client, runs, progress=progress)
    return "api"


def _wanted_key(key: str) -> bool:
    return not key.startswith(SYSTEM_PREFIX) and not key.startswith(SUMMARY_PREFIX)


def _histories_sql(tracking_uri: str, runs: Sequence[RunData]) -> None:
    import numpy as np
    import pandas as pd
    import sqlalchemy as sa

    engine = sa.create_engine(tracking_uri)
    ids = [r.run_id for r in runs]
    frames = []
    try:
        with engine.connect() as conn:
            for i in range(0, len(ids), 500):
                chunk = ids[i : i + 500]
                stmt = sa.text(
                    "SELECT run_uuid, key, step, value, is_nan, timestamp FROM metrics "
                    "WHERE run_uuid IN :ids AND key NOT LIKE 'system/%' AND key NOT LIKE 'summary.%'"
                ).bindparams(sa.bindparam("ids", expanding=True))
                rows = conn.execute(stmt, {"ids": chunk}).fetchall()
                if rows:
                    frames.append(
                        pd.DataFrame.from_records(
                            rows, columns=["run_id", "key", "step", "value", "is_nan", "ts"]
                        )
                    )
    finally:
        engine.dispose()
    by_run = {r.run_id: r for r in runs}
    for r in runs:
        r.history = {}
    if not frames:
        return
    df = pd.concat(frames, ignore_index=True)
    df["value"] = df["value"].astype("float64")
    nan_mask = df["is_nan"].astype(bool).to_numpy()
    if nan_mask.any():
        df.loc[nan_mask, "value"] = np.nan
    # A value logged twice at one step (a resumed ingestion): the newest wins.
    df = df.sort_values(["run_id", "key", "step", "ts"], kind="stable")
    df = df.drop_duplicates(["run_id", "key", "step"], keep="last")
    for (rid, key), g in df.groupby(["run_id", "key"], sort=False):
        by_run[rid].history[key] = (
            g["step"].to_numpy(dtype="int64"),
            g["value"].to_numpy(dtype="float64"),
        )


_STEP_OFFSET = 1 << 38  # packed rows: (key code << 40) | (is_nan << 39) | (step + offset)


def _histories_sqlite(tracking_uri: str, runs: Sequence[RunData]) -> None:
    """SQLite fast path: two numbers per row, read by two threads.

    Turning rows into Python objects is the cost (SQLite itself scans 3.5 M
    rows in under a second), so the key, NaN flag and step are packed into
    one integer in SQL and the rows go straight into a numpy record array.
    Rows come in insertion order (the run_uuid index keeps rowid order), so
    a value logged twice at one step is resolved as "the last write wins".
    sqlite3 releases the GIL while stepping, hence the second thread.
    """
    import sqlite3
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    from sqlalchemy.engine import make_url

    db = make_url(tracking_uri).database
    if not db:
        raise ValueError("in-memory SQLite store")
    keys = sorted({k for r in runs for k in r.metrics if _wanted_key(k)})
    klist = "|" + "|".join(keys) + "|"
    query = (
        "SELECT (instr(?1, '|' || key || '|') << 40) + (is_nan << 39) + (step + ?2), value "
        "FROM metrics WHERE run_uuid = ?3 AND instr(?1, '|' || key || '|') > 0"
    )
    dtype = np.dtype([("p", "i8"), ("v", "f8")])
    uri = Path(db).resolve().as_uri() + "?mode=ro"

    def load(run: RunData) -> tuple[RunData, dict[str, tuple[Any, Any]]]:
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        try:
            arr = np.fromiter(conn.execute(query, (klist, _STEP_OFFSET, run.run_id)), dtype=dtype)
        finally:
            conn.close()
        packed, values = arr["p"], arr["v"].copy()
        codes = packed >> 40
        nan = ((packed >> 39) & 1).astype(bool)
        steps = (packed & ((1 << 39) - 1)) - _STEP_OFFSET
        values[nan] = np.nan
        order = np.lexsort((steps, codes))  # stable: equal (key, step) keep write order
        codes, steps, values = codes[order], steps[order], values[order]
        last = np.ones(len(codes), dtype=bool)
        if len(codes) > 1:
            last[:-1] = (codes[1:] != codes[:-1]) | (steps[1:] != steps[:-1])
        codes, steps, values = codes[last], steps[last], values[last]
        out: dict[str, tuple[Any, Any]] = {}
        if len(codes):
            bounds = np.flatnonzero(np.diff(codes)) + 1
            starts = np.r_[0, bounds]
            ends = np.r_[bounds, len(codes)]
            for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
                pos = int(codes[a])
                key = klist[pos : klist.index("|", pos)]
                out[key] = (steps[a:b], values[a:b])
        return run, out

    if not Path(db).is_file():
        raise FileNotFoundError(db)
    with ThreadPoolExecutor(max_workers=2) as pool:
        for run, hist in pool.map(load, runs):
            run.history = hist


def _histories_api(client: Any, runs: Sequence[RunData], *, progress: Progress | None) -> None:
    """Public-API path: one get_metric_history per run and key, a few in parallel (servers)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    jobs = [(r, k) for r in runs for k in r.metrics if _wanted_key(k)]
    for r in runs:
        r.history = {}

    def load(job: tuple[RunData, str]) -> tuple[RunData, str, Any, Any]:
        run, key = job
        hist = client.get_metric_history(run.run_id, key)
        latest: dict[int, tuple[int, float]] = {}
        for m in hist:
            prev = latest.get(m.step)
            if prev is None or m.timestamp >= prev[0]:
                latest[m.step] = (m.timestamp, m.value)
        steps = np.array(sorted(latest), dtype="int64")
        values = np.array([latest[s][1] for s in steps.tolist()], dtype="float64")
        return run, key, steps, values

    with ThreadPoolExecutor(max_workers=4) as pool:
        for i, (run, key, steps, values) in enumerate(pool.map(load, jobs)):
            run.history[key] = (steps, values)
            if progress and jobs and i % 20 == 0:
                progress(0.1 + 0.5 * i / len(jobs), f"metric history {i}/{len(jobs)}")


# -- per-run statistics -------------------------------------------------------


def warmup_of(run: RunData) -> int:
    """Warm-up steps: param warmup_steps, else the summary record's, else 0."""
    for value in (run.param("warmup_steps"), run.metrics.get("summary.warmup_steps")):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            return int(value)
    return 0


def post_warmup_mask(steps: Any, warmup: int) -> Any:
    """Steps after the first ``warmup`` optimizer steps.

    Steps are counted from 1 by the runners (from 0 by some programs); with
    ``log_interval`` > 1 the first logged step may already be past warm-up.
    """
    if len(steps) == 0:
        return steps.astype(bool)
    base = 0 if int(steps.min()) == 0 else 1
    return steps >= base + warmup


def tokens_per_step(run: RunData) -> float | None:
    """Tokens one optimizer step consumes across all ranks.

    Recorded by the runner (param/tag ``tokens_per_step``) when known, else
    micro_batch x grad_accum x seq_length x data-parallel ranks.
    """
    for value in (
        run.param("tokens_per_step"),
        parse_value(run.tags.get("dstui.tokens_per_step", "")) if run.tags.get("dstui.tokens_per_step") else None,
    ):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
    mb, ga, seq = run.param("micro_batch"), run.param("grad_accum", 1), run.param("seq_length")
    gpus, nodes, sp = run.param("gpus", 1), run.param("nodes", 1), run.param("sequence_parallel", 1)
    nums = (mb, ga, seq, gpus, nodes, sp)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in nums):
        return None
    return float(mb * ga * seq * gpus * nodes / sp)


def _finite(values: Any) -> Any:
    import numpy as np

    return values[np.isfinite(values)]


def compute_run_stats(run: RunData) -> dict[str, Any]:
    """Summary figures of one run from its history (see the module docstring)."""
    import numpy as np

    warmup = warmup_of(run)
    st: dict[str, Any] = {"warmup_steps": warmup}
    st["points"] = max((len(s) for s, _ in run.history.values()), default=0)
    st["warmup_used_all"] = False

    def post(key: str) -> Any:
        if key not in run.history:
            return None
        steps, values = run.history[key]
        mask = post_warmup_mask(steps, warmup)
        if not mask.any() and len(values):
            st["warmup_used_all"] = True  # short run: statistics over every point
            return values
        return values[mask]

    it = post("iter_time")
    if it is not None and len(_finite(it)):
        itf = _finite(it)
        st["iter_points"] = int(len(itf))
        st["iter_time_mean"] = float(itf.mean())
        st["iter_time_std"] = float(itf.std(ddof=1)) if len(itf) > 1 else 0.0
        st["iter_time_median"] = float(np.median(itf))
        st["iter_time_min"] = float(itf.min())
        st["iter_time_max"] = float(itf.max())
        steps, values = run.history["iter_time"]
        mask = post_warmup_mask(steps, warmup)
        if not mask.any():
            mask = np.ones(len(steps), dtype=bool)
        limit = OUTLIER_FACTOR * st["iter_time_median"]
        bad = mask & np.isfinite(values) & (values > limit)
        st["outlier_steps"] = steps[bad].tolist()
        st["outlier_values"] = values[bad].tolist()
    else:
        st["iter_points"] = 0
        summary_mean = run.metrics.get("summary.iter_time_mean")
        if summary_mean is not None and math.isfinite(summary_mean):
            # No per-step history (e.g. an import of a summary line only).
            st["iter_time_mean"] = float(summary_mean)
            st["iter_time_std"] = float(run.metrics.get("summary.iter_time_std", 0.0) or 0.0)
        st["outlier_steps"] = []
        st["outlier_values"] = []
    tps = post("tokens_per_s")
    if tps is not None and len(_finite(tps)):
        st["tokens_per_s_mean"] = float(_finite(tps).mean())
    elif st.get("iter_time_mean"):
        tok = tokens_per_step(run)
        if tok:
            st["tokens_per_s_mean"] = tok / st["iter_time_mean"]
            st["tokens_per_s_derived"] = True
    for key in ("mfu", "tflops_per_gpu"):
        vals = post(key)
        if vals is not None and len(_finite(vals)):
            st[f"{key}_mean"] = float(_finite(vals).mean())
        elif f"summary.{key}_mean" in run.metrics:
            st[f"{key}_mean"] = float(run.metrics[f"summary.{key}_mean"])
    for key in ("mem_peak", "mem_alloc"):
        if key in run.history and len(_finite(run.history[key][1])):
            st[f"{key}_max"] = float(_finite(run.history[key][1]).max())
    if "mem_peak_max" not in st and "summary.mem_peak_max" in run.metrics:
        st["mem_peak_max"] = float(run.metrics["summary.mem_peak_max"])
    if "loss" in run.history and len(run.history["loss"][1]):
        steps, values = run.history["loss"]
        st["final_loss"] = float(values[-1])
        st["final_step"] = int(steps[-1])
        st["loss_nan"] = bool(np.isnan(values).any())
    elif "summary.final_loss" in run.metrics:
        st["final_loss"] = float(run.metrics["summary.final_loss"])
    tok = tokens_per_step(run)
    if tok:
        st["tokens_per_step"] = tok
    return st


# -- conditions ---------------------------------------------------------------


def assign_labels(runs: Sequence[RunData]) -> None:
    """Condition label; the revision joins it when runs span several revisions."""
    revisions = {r.revision for r in runs}
    for r in runs:
        r.label = f"{r.condition} @ {r.revision}" if len(revisions) > 1 else r.condition


@dataclass
class ConditionStats:
    """Aggregate of one condition's repeats (only usable runs feed the numbers)."""

    label: str
    condition: str
    revision: str
    kind: str
    runs: list[RunData]
    n_runs: int = 0
    n_usable: int = 0
    n_failed: int = 0
    n_oom: int = 0
    statuses: str = ""
    iter_points: int = 0
    iter_time_mean: float | None = None
    iter_time_std: float | None = None
    iter_time_repeat_std: float | None = None
    tokens_per_s_mean: float | None = None
    tokens_per_s_derived: bool = False
    mfu_mean: float | None = None
    tflops_per_gpu_mean: float | None = None
    mem_peak_max: float | None = None
    final_loss: float | None = None
    outliers: int = 0
    reasons: list[str] = field(default_factory=list)

    @property
    def mem_peak_gb(self) -> float | None:
        return None if self.mem_peak_max is None else self.mem_peak_max / GB

    def as_row(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "condition": self.condition,
            "revision": self.revision,
            "kind": self.kind,
            "runs": self.n_runs,
            "usable": self.n_usable,
            "failed": self.n_failed,
            "oom": self.n_oom,
            "status": self.statuses,
            "iter_points": self.iter_points,
            "iter_time_mean_s": self.iter_time_mean,
            "iter_time_std_s": self.iter_time_std,
            "iter_time_repeat_std_s": self.iter_time_repeat_std,
            "tokens_per_s": self.tokens_per_s_mean,
            "mfu": self.mfu_mean,
            "tflops_per_gpu": self.tflops_per_gpu_mean,
            "mem_peak_gb": self.mem_peak_gb,
            "final_loss": self.final_loss,
            "outliers": self.outliers,
            "reasons": "; ".join(self.reasons),
        }


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else None


def condition_stats(runs: Sequence[RunData]) -> list[ConditionStats]:
    """One :class:`ConditionStats` per label, in first-seen order."""
    import numpy as np

    groups: dict[str, list[RunData]] = {}
    for r in runs:
        groups.setdefault(r.label, []).append(r)
    out = []
    for label, members in groups.items():
        first = members[0]
        cs = ConditionStats(label=label, condition=first.condition, revision=first.revision, kind=first.kind, runs=members)
        cs.n_runs = len(members)
        usable = [r for r in members if r.usable]
        cs.n_usable = len(usable)
        cs.n_failed = sum(1 for r in members if r.status in FAILED_STATES)
        cs.n_oom = sum(1 for r in members if r.oom)
        counts: dict[str, int] = {}
        for r in members:
            name = "OOM" if r.oom else r.status
            counts[name] = counts.get(name, 0) + 1
        cs.statuses = ", ".join(f"{n} {k}" if n > 1 or len(members) > 1 else k for k, n in counts.items())
        cs.reasons = sorted({r.reason for r in members if r.reason and not r.usable})
        pooled = []
        for r in usable:
            if "iter_time" in r.history and r.stats.get("iter_points"):
                steps, values = r.history["iter_time"]
                mask = post_warmup_mask(steps, r.stats["warmup_steps"])
                if not mask.any():
                    mask = np.ones(len(steps), dtype=bool)
                vals = values[mask]
                pooled.append(vals[np.isfinite(vals)])
        if pooled:
            allv = np.concatenate(pooled)
            cs.iter_points = int(len(allv))
            cs.iter_time_mean = float(allv.mean())
            cs.iter_time_std = float(allv.std(ddof=1)) if len(allv) > 1 else 0.0
        else:
            cs.iter_time_mean = _mean(r.stats.get("iter_time_mean") for r in usable)
            cs.iter_time_std = _mean(r.stats.get("iter_time_std") for r in usable)
        run_means = [r.stats["iter_time_mean"] for r in usable if r.stats.get("iter_time_mean") is not None]
        if len(run_means) > 1:
            cs.iter_time_repeat_std = float(np.std(run_means, ddof=1))
        cs.tokens_per_s_mean = _mean(r.stats.get("tokens_per_s_mean") for r in usable)
        cs.tokens_per_s_derived = any(r.stats.get("tokens_per_s_derived") for r in usable)
        cs.mfu_mean = _mean(r.stats.get("mfu_mean") for r in usable)
        cs.tflops_per_gpu_mean = _mean(r.stats.get("tflops_per_gpu_mean") for r in usable)
        cs.mem_peak_max = _mean(r.stats.get("mem_peak_max") for r in usable)
        cs.final_loss = _mean(r.stats.get("final_loss") for r in usable)
        cs.outliers = sum(len(r.stats.get("outlier_steps", [])) for r in usable)
        out.append(cs)
    return out


def loss_band(cs: ConditionStats) -> tuple[Any, Any, Any, Any] | None:
    """(steps, mean, min, max) of the loss over the usable repeats, per step."""
    import pandas as pd

    series = []
    for r in cs.runs:
        if r.usable and "loss" in r.history and len(r.history["loss"][0]):
            steps, values = r.history["loss"]
            series.append(pd.Series(values, index=steps, name=r.run_id))
    if not series:
        return None
    df = pd.concat(series, axis=1).sort_index()
    return (
        df.index.to_numpy(),
        df.mean(axis=1, skipna=True).to_numpy(),
        df.min(axis=1, skipna=True).to_numpy(),
        df.max(axis=1, skipna=True).to_numpy(),
    )


# -- loss parity --------------------------------------------------------------


@dataclass
class Parity:
    """Loss of one condition against the baseline's, step by step."""

    label: str
    baseline: str
    common_steps: int
    max_abs_diff: float | None
    mean_abs_diff: float | None
    final_diff: float | None
    tolerance: float
    verdict: str  # PASS, FAIL or n/a
    note: str = ""
    speedup: float | None = None  # baseline iter time / this iter time
    mem_ratio: float | None = None  # this peak memory / baseline's

    def as_row(self) -> dict[str, Any]:
        return dict(self.__dict__)


def loss_parity(
    conds: Sequence[ConditionStats], baseline: str, tolerance: float
) -> list[Parity]:
    """PASS/FAIL per condition: max |mean loss - baseline mean loss| <= tolerance."""
    import numpy as np

    by_label = {c.label: c for c in conds}
    base = by_label[baseline]
    base_band = loss_band(base)
    out = []
    for c in conds:
        if c.label == baseline:
            continue
        p = Parity(c.label, baseline, 0, None, None, None, tolerance, "n/a")
        if base.iter_time_mean and c.iter_time_mean:
            p.speedup = base.iter_time_mean / c.iter_time_mean
        if base.mem_peak_max and c.mem_peak_max:
            p.mem_ratio = c.mem_peak_max / base.mem_peak_max
        band = loss_band(c)
        if base_band is None or band is None:
            if band is None:
                p.note = "no usable runs" if not c.n_usable else "no loss history"
            else:
                p.note = "baseline has no loss history"
            out.append(p)
            continue
        common, ia, ib = np.intersect1d(band[0], base_band[0], return_indices=True)
        p.common_steps = int(len(common))
        if not len(common):
            p.note = "no common steps"
            out.append(p)
            continue
        diff = np.abs(band[1][ia] - base_band[1][ib])
        if np.isnan(diff).any():
            p.verdict = "FAIL"
            p.note = "NaN loss"
            p.max_abs_diff = float("nan")
        else:
            p.max_abs_diff = float(diff.max())
            p.mean_abs_diff = float(diff.mean())
            p.verdict = "PASS" if p.max_abs_diff <= tolerance else "FAIL"
        p.final_diff = float(band[1][ia][-1] - base_band[1][ib][-1])
        out.append(p)
    return out


def choose_baseline(conds: Sequence[ConditionStats], requested: str | None) -> str | None:
    """The requested condition (by label or condition name), else the first usable train one."""
    if requested:
        for c in conds:
            if requested in (c.label, c.condition):
                return c.label
        known = ", ".join(c.label for c in conds)
        raise ReportError(f"baseline '{requested}' is not among the conditions ({known})")
    for c in conds:
        if c.kind != "verify" and c.n_usable:
            return c.label
    return None


# -- grids (seed 004) ---------------------------------------------------------


def level_of(run: RunData) -> str:
    """ZeRO stage plus offload, the 'optimization level' of seed 004's grids."""
    stage = run.param("zero_stage", "?")
    parts = [f"ZeRO-{stage}"]
    off = run.param("offload", "none")
    if off not in (None, "none", False):
        parts.append(f"offload {off}")
    poff = run.param("offload_params", "none")
    if poff not in (None, "none", False):
        parts.append(f"param offload {poff}")
    return " + ".join(parts)


def wants_grid(runs: Sequence[RunData]) -> bool:
    """A grid helps when model or micro_batch is an axis of the experiment.

    That is: within one ZeRO/offload level, two runs share the model but not
    the micro batch, or the micro batch but not the model. A plain ZeRO 1/2/3
    comparison (one model, one micro batch) gets no grid.
    """
    train = [r for r in runs if r.kind != "verify"]
    if not train or not all("model" in r.params and "micro_batch" in r.params for r in train):
        return False
    seen: dict[tuple[str, str], set[str]] = {}
    for r in train:
        level = level_of(r)
        seen.setdefault((level, "m:" + r.params["model"]), set()).add(r.params["micro_batch"])
        seen.setdefault((level, "b:" + r.params["micro_batch"]), set()).add(r.params["model"])
    return any(len(v) > 1 for v in seen.values())


def _sort_key(v: Any) -> tuple[int, Any]:
    pv = parse_value(str(v))
    return (0, pv) if isinstance(pv, (int, float)) else (1, str(pv))


def grids(runs: Sequence[RunData]) -> dict[str, dict[str, Any]]:
    """{'iter_time': {level: DataFrame}, 'mem': {level: DataFrame}} with OOM/FAIL cells.

    A cell is the mean over usable runs of that (level, model, micro_batch);
    when no run of the cell is usable it reads OOM if any failed for lack of
    memory, else FAIL, else '' (not run).
    """
    import pandas as pd

    train = [r for r in runs if r.kind != "verify"]
    models = sorted({r.params["model"] for r in train}, key=_sort_key)
    mbs = sorted({r.params["micro_batch"] for r in train}, key=_sort_key)
    levels: dict[str, list[RunData]] = {}
    for r in train:
        levels.setdefault(level_of(r), []).append(r)
    out: dict[str, dict[str, Any]] = {"iter_time": {}, "mem": {}}
    for level in sorted(levels, key=lambda s: s):
        members = levels[level]
        frames = {
            name: pd.DataFrame("", index=pd.Index(models, name="model"), columns=mbs, dtype=object)
            for name in out
        }
        for model in models:
            for mb in mbs:
                cell = [r for r in members if r.params["model"] == model and r.params["micro_batch"] == mb]
                if not cell:
                    continue
                usable = [r for r in cell if r.usable]
                it = _mean(r.stats.get("iter_time_mean") for r in usable)
                mem = _mean(r.stats.get("mem_peak_max") for r in usable)
                if usable and (it is not None or mem is not None):
                    frames["iter_time"].loc[model, mb] = round(it, 6) if it is not None else "n/a"
                    frames["mem"].loc[model, mb] = round(mem / GB, 3) if mem is not None else "n/a"
                else:
                    mark = "OOM" if any(r.oom for r in cell) else (
                        "FAIL" if any(r.status in FAILED_STATES for r in cell) else r_state(cell)
                    )
                    frames["iter_time"].loc[model, mb] = mark
                    frames["mem"].loc[model, mb] = mark
        for name, frame in frames.items():
            frame.columns = pd.Index([str(c) for c in mbs], name="micro_batch")
            out[name][level] = frame
    return out


def r_state(cell: Sequence[RunData]) -> str:
    """Marker for a grid cell whose runs have not produced numbers yet."""
    states = {r.status for r in cell}
    return "/".join(sorted(states)) if states else ""


# -- recommendations ----------------------------------------------------------


def pareto(conds: Sequence[ConditionStats]) -> list[ConditionStats]:
    """Conditions no other condition beats on both iteration time and peak memory."""
    pts = [c for c in conds if c.iter_time_mean is not None and c.mem_peak_max is not None]
    front = []
    for c in pts:
        dominated = any(
            o is not c
            and o.iter_time_mean <= c.iter_time_mean  # type: ignore[operator]
            and o.mem_peak_max <= c.mem_peak_max  # type: ignore[operator]
            and (o.iter_time_mean < c.iter_time_mean or o.mem_peak_max < c.mem_peak_max)  # type: ignore[operator]
            for o in pts
        )
        if not dominated:
            front.append(c)
    return sorted(front, key=lambda c: c.iter_time_mean)  # type: ignore[arg-type, return-value]


def common_and_varying(runs: Sequence[RunData]) -> tuple[dict[str, str], list[str]]:
    """Params equal in every run, and the names of those that differ (ds.* left out)."""
    keys: set[str] = set()
    for r in runs:
        keys.update(k for k in r.params if not k.startswith("ds."))
    common, varying = {}, []
    for k in sorted(keys):
        vals = {r.params.get(k) for r in runs}
        if len(vals) == 1 and None not in vals:
            common[k] = next(iter(vals))  # type: ignore[assignment]
        else:
            varying.append(k)
    return common, varying


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
