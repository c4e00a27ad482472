"""Sequence-parallel runs beside the same training without sequence parallelism (seed 003: what does each mode cost?).

One row per run with ``sequence_parallel > 1``: its mode (Ulysses eager / compile /
DeepCompile, or ring), sp x dp, ZeRO stage, sequence length, mean step time after warm-up,
tokens/s and peak memory, beside the same three figures of a no-SP run at the same sequence
length. That no-SP run is, in this order of preference:

1. a run of the report without sequence parallelism with the same model, sequence length,
   dtype, ranks, ZeRO stage and compile setting (a condition measured on its own);
2. the sp-check's own no-SP run (summary ``nosp_*``, runners/sp_check.py): the same ranks,
   sequence length and ZeRO stage, compiled the same way as the SP run (the noise twin for
   compile/DeepCompile, the reference for eager/ring). A compiled SP run checked with given
   tolerances has none (no twin ran), and then no figure is shown rather than an eager one.

Peak memory on a CPU is the process's RSS peak, which the check's no-SP run cannot separate
from the SP run's: no no-SP figure there. The verdict comes with its evidence: the loss and
tensor margins, or the first difference the check named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dstui.analysis.checks import CheckResult
from dstui.analysis.checks import finite_number as _num
from dstui.analysis.rundata import RunData

# what must agree for a no-SP run of the report to stand beside an SP run
_LIKE = ("model", "seq_length", "dtype", "gpus", "nodes", "zero_stage", "micro_batch", "dataset")
MODE_WORDS = {"eager": "Ulysses eager", "compile": "Ulysses torch.compile", "deepcompile": "Ulysses DeepCompile",
              "ring": "ring attention"}  # fmt: skip


@dataclass
class NoSp:
    """The no-SP figures an SP run is set beside, and where they come from."""

    source: str  # "run <name>" or "sp-check (<mode>)"
    iter_time: float | None
    tokens_per_s: float | None
    mem_peak: float | None


@dataclass
class SpRow:
    run_name: str
    label: str
    mode: str
    sp: int
    dp: int
    zero: Any
    seq_length: Any
    iter_time: float | None
    tokens_per_s: float | None
    mem_peak: float | None
    verdict: str
    evidence: str
    nosp: NoSp | None


def _sp(run: RunData) -> int:
    try:
        return int(run.param("sequence_parallel", 1) or 1)
    except (TypeError, ValueError):
        return 1


def _compiled(run: RunData) -> str:
    """How the engine was compiled: deepcompile, compile or eager (the sp_mode counts with SP)."""
    mode = str(run.param("sp_mode", "eager")) if _sp(run) > 1 else ""
    if run.param("deepcompile") is True or mode == "deepcompile":
        return "deepcompile"
    if run.param("compile") is True or mode == "compile":
        return "compile"
    return "eager"


def _measured_nosp(run: RunData, plain: list[RunData]) -> NoSp | None:
    want = {k: run.params.get(k) for k in _LIKE}
    for other in plain:
        if {k: other.params.get(k) for k in _LIKE} == want and _compiled(other) == _compiled(run):
            st = other.stats
            return NoSp(f"run {other.run_name}", _num(st.get("iter_time_mean")), _num(st.get("tokens_per_s_mean")),
                        _num(st.get("mem_peak_max")))  # fmt: skip
    return None


def _check_nosp(run: RunData) -> NoSp | None:
    m = run.metrics
    it = _num(m.get("summary.nosp_iter_time_mean"))
    if it is None:
        return None
    return NoSp("sp-check's no-SP run", it, _num(m.get("summary.nosp_tokens_per_s_mean")), _num(m.get("summary.nosp_mem_peak_max")))


def _evidence(check: CheckResult | None, run: RunData) -> str:
    if check is None:
        return "no sp-check"
    if check.verdict != "PASS":
        return check.reason or run.reason or "FAIL (no reason recorded)"
    parts = []
    loss = _num(run.metrics.get("summary.margin"))
    parts.append(f"loss margin {loss:.3g}" if loss is not None else "losses identical")
    rel = _num(run.metrics.get("summary.tensor_max_rel"))
    tmargin = _num(run.metrics.get("summary.tensor_margin"))
    if rel is not None:
        parts.append(f"tensors: largest relative difference {rel:.2g}"
                     + (f" (margin {tmargin:.3g})" if tmargin is not None else " (identical)"))  # fmt: skip
    return "; ".join(parts)


def sp_rows(runs: list[RunData], checks: list[CheckResult]) -> list[SpRow]:
    """The report's sequence-parallel rows, in the runs' order (``runs`` carry their stats)."""
    by_id = {c.run.run_id: c for c in checks}
    plain = [r for r in runs if _sp(r) == 1 and r.usable and r.kind == "train"]
    rows = []
    for r in runs:
        sp = _sp(r)
        if sp <= 1 or r.kind != "train":
            continue
        ranks = int(_num(r.param("gpus", 1)) or 1) * int(_num(r.param("nodes", 1)) or 1)
        check = by_id.get(r.run_id)
        st = r.stats
        rows.append(SpRow(
            run_name=r.run_name, label=r.label or r.condition, mode=MODE_WORDS.get(str(r.param("sp_mode", "eager")), "?"),
            sp=sp, dp=max(1, ranks // sp), zero=r.param("zero_stage"), seq_length=r.param("seq_length"),
            iter_time=_num(st.get("iter_time_mean")), tokens_per_s=_num(st.get("tokens_per_s_mean")),
            mem_peak=_num(st.get("mem_peak_max")), verdict=check.verdict if check else "n/a",
            evidence=_evidence(check, r), nosp=_measured_nosp(r, plain) or _check_nosp(r),
        ))  # fmt: skip
    return rows
