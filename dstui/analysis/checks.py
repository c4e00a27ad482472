"""What the runners' own checks said: verify (loss/grad/param parity, seed 002) and Ulysses sp-check (seed 003).

Read from MLflow only: the verdict tag, ``summary.*`` metrics, the per-step
difference metrics, and (for lists such as the worst tensors, which are no
metric) the tag ``dstui.worst`` or the summary records of the run's
``run/metrics.jsonl`` artifact.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from dstui.analysis.rundata import RunData
from dstui.core import verdicts
from dstui.tracking import tags as tag_keys

DIFF_KEYS = ("loss_abs_diff", "grad_max_abs_diff", "param_max_abs_diff", "grad_max_rel_diff", "param_max_rel_diff",
             "grad_l2_rel_diff")


@dataclass
class CheckResult:
    """One run's check: verdict, where it diverged, by how much, and on which tensors."""

    run: RunData
    check: str  # "verify" or "sp-check"
    verdict: str  # PASS, FAIL or n/a
    first_diverging_step: int | None = None
    reason: str = ""
    rtol: float | None = None
    atol: float | None = None
    tolerance_basis: str = ""
    maxima: dict[str, float] = field(default_factory=dict)
    worst: list[dict[str, Any]] = field(default_factory=list)
    #: the verdict's numbers in one line (dstui.core.verdicts): the grad-norm ratio and the error's shape
    evidence: str = ""
    ratio_range: tuple[float, float, int] | None = None  # smallest and largest grad-norm ratio, steps
    margin: float | None = None  # largest difference / its tolerance (PASS: <= 1)
    shape_kind: str = ""  # rounding-level, uniform, rank-local, micro-batch, no simple shape
    steps_run: int | None = None


def _summary_records(run: RunData) -> list[dict[str, Any]]:
    from dstui.analysis.fetch import read_artifact

    out = []
    for line in read_artifact(run, "run/metrics.jsonl").splitlines():
        if '"summary"' not in line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("type") == "summary":
            out.append(rec)
    return out


def finite_number(v: Any) -> float | None:
    """``v`` as a finite float, else None (MLflow values, JSON fields: anything may come)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def check_of(run: RunData) -> CheckResult:
    """The run's check as recorded (verify runs and sp-check runs)."""
    m = run.metrics
    summary: dict[str, Any] = {}
    tag_worst = run.tags.get(tag_keys.WORST, "")
    needs_artifact = not tag_worst and (run.kind == "verify" or run.param("sp_check"))
    if needs_artifact:
        for rec in _summary_records(run):
            summary.update({k: v for k, v in rec.items() if v is not None})
    check = "sp-check" if (summary.get("check") == "sp-check" or run.param("sp_check")) and run.kind != "verify" else "verify"
    res = CheckResult(run=run, check=check, verdict=run.tags.get(tag_keys.VERDICT) or str(summary.get("verdict") or "n/a"))
    first = finite_number(m.get("summary.first_diverging_step"))
    if first is None:
        first = finite_number(summary.get("first_diverging_step"))
    if first is None and "within_tol" in run.history:
        steps, values = run.history["within_tol"]
        bad = [int(s) for s, v in zip(steps.tolist(), values.tolist(), strict=False) if v == 0]
        first = float(bad[0]) if bad else None
    res.first_diverging_step = int(first) if first is not None else None
    res.reason = str(summary.get("reason") or "")
    res.rtol = finite_number(m.get("summary.rtol", summary.get("rtol", run.param("rtol"))))
    res.atol = finite_number(m.get("summary.atol", summary.get("atol", run.param("atol"))))
    tol = summary.get("tolerance")
    if isinstance(tol, dict):
        res.rtol, res.atol = finite_number(tol.get("rtol")) or res.rtol, finite_number(tol.get("atol")) or res.atol
    res.tolerance_basis = str(summary.get("tolerance_basis") or run.tags.get(tag_keys.TOLERANCE_BASIS, ""))
    for k in DIFF_KEYS:
        v = finite_number(m.get(f"summary.{k}_max"))
        if v is None and k in run.history and len(run.history[k][1]):
            v = finite_number(max(run.history[k][1].tolist()))
        if v is not None:
            res.maxima[k] = v
    worst: Any = summary.get("worst")
    if tag_worst:
        try:
            worst = json.loads(tag_worst)
        except ValueError:
            worst = None
    if isinstance(worst, list):
        res.worst = [w for w in worst if isinstance(w, dict) and w.get("name")]
        res.worst.sort(key=lambda w: -(finite_number(w.get("max_abs_diff")) or 0.0))
    _evidence(res, summary)
    return res


def _evidence(res: CheckResult, summary: dict[str, Any]) -> None:
    """The grad-norm ratios, margin and shape: from the summary record, else the step metrics."""
    run = res.run
    res.evidence = run.tags.get(tag_keys.EVIDENCE) or verdicts.evidence(summary) or ""
    res.ratio_range = verdicts.ratio_range(summary)
    if res.ratio_range is None and "grad_norm_ratio" in run.history and len(run.history["grad_norm_ratio"][1]):
        values = [v for v in run.history["grad_norm_ratio"][1].tolist() if math.isfinite(v)]
        res.ratio_range = (min(values), max(values), len(values)) if values else None
    res.margin = finite_number(run.metrics.get("summary.margin_max", summary.get("margin_max")))
    res.shape_kind = str(summary.get("grad_shape_kind") or "")[:40]
    steps = finite_number(run.metrics.get("summary.steps", summary.get("steps")))
    res.steps_run = int(steps) if steps is not None else None


def sp_check_runs(runs: list[RunData]) -> list[CheckResult]:
    """Runs that ran the Ulysses sp-check (param sp_check true), with their verdicts."""
    return [check_of(r) for r in runs if r.kind != "verify" and r.param("sp_check") is True]
