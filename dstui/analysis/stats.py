"""Statistics of runs and conditions: warm-up, means, spread, outliers, loss bands.

Everything a report shows is computed in :mod:`dstui.analysis`, from MLflow runs laid out
as ``docs/ARCHITECTURE.md`` describes (child runs tagged ``dstui.role=run``), so that live,
old, imported and team-server runs are treated alike. Charts (:mod:`dstui.report.charts`) and
markdown (:mod:`dstui.report.markdown`) only format these numbers; the tests check them
against figures computed independently.

Definitions (the report repeats them so a reader does not have to guess):

* a *condition* is the runs that ran with the same settings (:mod:`~dstui.analysis.grouping`):
  runs that never started are in none, and one spec condition run with other settings in
  another batch (other ``steps``, another DeepSpeed) is a condition of its own;
* a *step* is one optimizer step (``grad_accum`` micro-batches);
* per-run statistics exclude the first ``warmup_steps`` optimizer steps
  (param ``warmup_steps``), because the first steps include compilation,
  allocator growth and NCCL set-up;
* a condition's iteration time is the mean over the post-warm-up iterations
  of all its usable repeats, its error bar the sample standard deviation
  (n-1) of those same iterations;
* throughput (tokens/s), TFLOP/s and MFU are total work / total time over
  those same iterations: the harmonic mean of the per-step rates (tokens per
  step / mean iteration time when every step does the same work), never the
  arithmetic mean of rates, which overstates them when step times vary;
* an iteration is an *outlier* when it takes more than ``OUTLIER_FACTOR``
  times the median post-warm-up iteration of its run;
* loss parity compares per-step mean losses (mean over repeats) on the steps
  both conditions logged, warm-up included (loss is deterministic from step
  one): PASS when the largest absolute difference is within the tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dstui.analysis.identity import merged
from dstui.analysis.rundata import FAILED_STATES, GB, OUTLIER_FACTOR, RunData, parse_value
from dstui.core.metric_catalogue import first_counted_step, skips_warmup, warmup_count
from dstui.tracking import tags as tag_keys


def warmup_of(run: RunData) -> int:
    """Warm-up steps: param warmup_steps, else the summary record's, else 0."""
    for value in (run.param("warmup_steps"), run.metrics.get("summary.warmup_steps")):
        count = warmup_count(value)
        if count is not None:
            return count
    return 0


def post_warmup_mask(steps: Any, warmup: int) -> Any:
    """Steps after the first ``warmup`` optimizer steps (the catalogue's rule: :func:`first_counted_step`)."""
    if len(steps) == 0:
        return steps.astype(bool)
    return steps >= first_counted_step(int(steps.min()), warmup)


def tokens_per_step(run: RunData) -> float | None:
    """Tokens one optimizer step consumes across all ranks.

    Recorded by the runner (param/tag ``tokens_per_step``) when known, else
    micro_batch x grad_accum x seq_length x data-parallel ranks.
    """
    for value in (
        run.param("tokens_per_step"),
        parse_value(run.tags.get(tag_keys.TOKENS_PER_STEP, "")) if run.tags.get(tag_keys.TOKENS_PER_STEP) else None,
    ):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
    if run.kind == "command":
        return None  # a user's command: dstui's settings are not what it trained with
    mb, ga, seq = run.param("micro_batch"), run.param("grad_accum", 1), run.param("seq_length")
    gpus, nodes, sp = run.param("gpus", 1), run.param("nodes", 1), run.param("sequence_parallel", 1)
    nums = (mb, ga, seq, gpus, nodes, sp)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in nums):
        return None
    return float(mb * ga * seq * gpus * nodes / sp)


def _finite(values: Any) -> Any:
    import numpy as np

    return values[np.isfinite(values)]


def _positive(values: Any) -> Any:
    import numpy as np

    return values[np.isfinite(values) & (values > 0)]


def rate_mean(rates: Any) -> float:
    """The rate over the whole span: the harmonic mean of per-step rates.

    A per-step rate (tokens/s, TFLOP/s, MFU) is work / that step's time, so
    total work / total time is n / sum(1 / rate) when every step does the
    same work (tokens per step / mean iteration time). The arithmetic mean
    of rates weighs a fast step as much as a slow one that took far longer,
    and overstates throughput whenever step times vary (one 20 ms step among
    260 ms ones nearly doubled it).
    """
    vals = _positive(rates)
    return float(len(vals) / (1.0 / vals).sum())


def pooled_rate(pairs: Iterable[tuple[float | None, float | int | None]]) -> float | None:
    """The rate of (rate, steps) pairs taken together, as if their steps were one span.

    Each repeat's rate stands for ``steps`` steps of total time steps / rate
    (per unit of work), so pooling is a harmonic mean weighted by steps: the
    condition's rate then agrees with its pooled mean iteration time.
    """
    n = inv = 0.0
    for rate, steps in pairs:
        if rate is None or not math.isfinite(rate) or rate <= 0:
            continue
        w = float(steps) if steps else 1.0
        n += w
        inv += w / rate
    return n / inv if inv > 0 else None


# what another run beside it changes: its timings (memory and loss are its own either way)
TIMING_KEYS = (
    "iter_time_mean", "iter_time_std", "iter_time_median", "iter_time_min", "iter_time_max", "tokens_per_s_mean",
    "tokens_per_s_points", "tokens_per_s_derived", "mfu_mean", "mfu_points", "tflops_per_gpu_mean",
    "tflops_per_gpu_points", "compile_time",
)  # fmt: skip


def compute_run_stats(run: RunData, *, include_overlapped: bool = False) -> dict[str, Any]:
    """Summary figures of one run from its history (see the module docstring).

    A run timed while another run shared the machine (tag ``dstui.overlapped``)
    keeps its memory and loss figures; its timings move to ``overlapped_timings``
    and feed no mean, ratio or "fastest" unless ``include_overlapped``.
    """
    warmup = warmup_of(run)
    st: dict[str, Any] = {"warmup_steps": warmup}
    st["points"] = max((len(s) for s, _ in run.history.values()), default=0)
    st["warmup_used_all"] = False

    def post(key: str) -> Any:
        """The key's values after warm-up (every value when warm-up took them all: a short run), for the
        metrics whose warm-up is a spike (:mod:`dstui.core.metric_catalogue`); every value for the others."""
        if key not in run.history:
            return None
        steps, values = run.history[key]
        if not skips_warmup(key):
            return values
        mask = post_warmup_mask(steps, warmup)
        if not mask.any() and len(values):
            st["warmup_used_all"] = True
            return values
        return values[mask]

    _iter_stats(run, post("iter_time"), warmup, st)
    _rate_stats(run, post, st)
    _memory_stats(run, st)
    ct = run.metrics.get("summary.compile_time")
    if ct is not None and math.isfinite(ct) and ct > 0:
        st["compile_time"] = float(ct)
    _loss_stats(run, st)
    tok = tokens_per_step(run)
    if tok:
        st["tokens_per_step"] = tok
    if run.overlapped:
        st["overlapped"] = True
        if not include_overlapped:
            st["overlapped_timings"] = {k: st.pop(k) for k in TIMING_KEYS if k in st}
            st["iter_points"], st["outlier_steps"], st["outlier_values"] = 0, [], []
            st["timings_left_out"] = True
    return st


def _iter_stats(run: RunData, it: Any, warmup: int, st: dict[str, Any]) -> None:
    """Iteration time after warm-up: mean, spread, extremes, outliers (or the summary record's mean)."""
    import numpy as np

    if "iter_time" in run.history:
        steps = run.history["iter_time"][0]
        st["warmup_points"] = int(len(steps) - post_warmup_mask(steps, warmup).sum())
    st["outlier_steps"], st["outlier_values"] = [], []
    if it is None or not len(_finite(it)):
        st["iter_points"] = 0
        summary_mean = run.metrics.get("summary.iter_time_mean")
        if summary_mean is not None and math.isfinite(summary_mean):
            # No per-step history (e.g. an import of a summary line only).
            st["iter_time_mean"] = float(summary_mean)
            st["iter_time_std"] = float(run.metrics.get("summary.iter_time_std", 0.0) or 0.0)
        return
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
    bad = mask & np.isfinite(values) & (values > OUTLIER_FACTOR * st["iter_time_median"])
    st["outlier_steps"] = steps[bad].tolist()
    st["outlier_values"] = values[bad].tolist()


def _rate_stats(run: RunData, post: Callable[[str], Any], st: dict[str, Any]) -> None:
    """tokens/s, MFU and TFLOP/s over the post-warm-up steps (tokens/s derived where not logged)."""
    tps = post("tokens_per_s")
    tps = _positive(tps) if tps is not None else None
    if tps is not None and len(tps):
        st["tokens_per_s_mean"], st["tokens_per_s_points"] = rate_mean(tps), len(tps)
    elif st.get("iter_time_mean"):
        tok = tokens_per_step(run)
        if tok:
            st["tokens_per_s_mean"] = tok / st["iter_time_mean"]
            st["tokens_per_s_points"] = st["iter_points"] or 1
            st["tokens_per_s_derived"] = True
    for key in ("mfu", "tflops_per_gpu"):
        vals = post(key)
        vals = _positive(vals) if vals is not None else None
        if vals is not None and len(vals):
            st[f"{key}_mean"], st[f"{key}_points"] = rate_mean(vals), len(vals)
        elif f"summary.{key}_mean" in run.metrics:
            st[f"{key}_mean"] = float(run.metrics[f"summary.{key}_mean"])


def _memory_stats(run: RunData, st: dict[str, Any]) -> None:
    """The largest peak and allocated memory the run logged (warm-up included), else its summary's."""
    for key in ("mem_peak", "mem_alloc"):
        if key in run.history and len(_finite(run.history[key][1])):
            st[f"{key}_max"] = float(_finite(run.history[key][1]).max())
    if "mem_peak_max" not in st and "summary.mem_peak_max" in run.metrics:
        st["mem_peak_max"] = float(run.metrics["summary.mem_peak_max"])
    if "mem_alloc_max" not in st and "summary.mem_alloc" in run.metrics:
        st["mem_alloc_max"] = float(run.metrics["summary.mem_alloc"])


def _loss_stats(run: RunData, st: dict[str, Any]) -> None:
    """Final and lowest loss, the last logged step, and whether any loss was NaN."""
    import numpy as np

    if "loss" in run.history and len(run.history["loss"][1]):
        steps, values = run.history["loss"]
        if np.isfinite(values).any():
            st["min_loss"] = float(np.nanmin(values))
        st["final_loss"] = float(values[-1])
        st["final_step"] = int(steps[-1])
        st["loss_nan"] = bool(np.isnan(values).any())
    elif "summary.final_loss" in run.metrics:
        st["final_loss"] = float(run.metrics["summary.final_loss"])


# -- conditions ---------------------------------------------------------------


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
    min_loss: float | None = None
    mem_alloc_max: float | None = None
    compile_time: float | None = None
    outliers: int = 0
    n_overlapped: int = 0  # usable runs that another run shared the machine with during their timed steps
    n_timings_left_out: int = 0  # ... whose timings feed none of the figures above (not --include-overlapped)
    reasons: list[str] = field(default_factory=list)
    settings: dict[str, str] = field(default_factory=dict)  # what its runs ran with, as far as they record it

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
            "min_loss": self.min_loss,
            "mem_alloc_gb": None if self.mem_alloc_max is None else self.mem_alloc_max / GB,
            "compile_time_s": self.compile_time,
            "outliers": self.outliers,
            "reasons": "; ".join(self.reasons),
        }


def finite_mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else None


def condition_stats(runs: Sequence[RunData]) -> list[ConditionStats]:
    """One :class:`ConditionStats` per label, in first-seen order; runs that never started are in none."""
    import numpy as np

    groups: dict[str, list[RunData]] = {}
    for r in runs:
        if not r.started:
            continue
        groups.setdefault(r.label, []).append(r)
    out = []
    for label, members in groups.items():
        first = members[0]
        cs = ConditionStats(label=label, condition=first.condition, revision=first.revision, kind=first.kind, runs=members)
        cs.n_runs = len(members)
        cs.settings = merged(members)
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
            cs.iter_time_mean = finite_mean(r.stats.get("iter_time_mean") for r in usable)
            cs.iter_time_std = finite_mean(r.stats.get("iter_time_std") for r in usable)
        run_means = [r.stats["iter_time_mean"] for r in usable if r.stats.get("iter_time_mean") is not None]
        if len(run_means) > 1:
            cs.iter_time_repeat_std = float(np.std(run_means, ddof=1))
        cs.tokens_per_s_mean = pooled_rate((r.stats.get("tokens_per_s_mean"), r.stats.get("tokens_per_s_points")) for r in usable)
        cs.tokens_per_s_derived = any(r.stats.get("tokens_per_s_derived") for r in usable)
        cs.mfu_mean = pooled_rate((r.stats.get("mfu_mean"), r.stats.get("mfu_points")) for r in usable)
        cs.tflops_per_gpu_mean = pooled_rate((r.stats.get("tflops_per_gpu_mean"), r.stats.get("tflops_per_gpu_points")) for r in usable)
        cs.mem_peak_max = finite_mean(r.stats.get("mem_peak_max") for r in usable)
        cs.final_loss = finite_mean(r.stats.get("final_loss") for r in usable)
        best = [r.stats["min_loss"] for r in usable if r.stats.get("min_loss") is not None]
        cs.min_loss = min(best) if best else None
        cs.mem_alloc_max = finite_mean(r.stats.get("mem_alloc_max") for r in usable)
        cs.compile_time = finite_mean(r.stats.get("compile_time") for r in usable)
        cs.outliers = sum(len(r.stats.get("outlier_steps", [])) for r in usable)
        cs.n_overlapped = sum(1 for r in usable if r.stats.get("overlapped"))
        cs.n_timings_left_out = sum(1 for r in usable if r.stats.get("timings_left_out"))
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


