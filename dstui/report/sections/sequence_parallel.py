"""Report section: sequence parallelism, each mode beside the no-SP run at the same sequence length.

A function of the analysis' rows (:func:`dstui.analysis.sequence_parallel.sp_rows`) to markdown,
so it renders wherever the rows come from.
"""

from __future__ import annotations

from collections.abc import Sequence

from dstui.analysis.sequence_parallel import SpRow
from dstui.core.formatting import fmt_bytes
from dstui.report.mdformat import bold, code, esc, fnum, table

INTRO = (
    "Each sequence-parallel run beside the same training without sequence parallelism at the same "
    "sequence length: the no-SP run is a condition of this report with the same model, sequence length, "
    "dtype, ranks, ZeRO stage and compile setting where there is one, else the sp-check's own no-SP run "
    "(same ranks, compiled the same way). Step time is the mean after warm-up, tokens/s the whole job's, "
    "peak memory rank 0's (one GPU's; on a CPU the process's RSS, which the check cannot split: "
    "no no-SP figure there). The verdict is the sp-check's: Q/K/V before and after the exchange and the "
    "attention outputs of chosen layers at step 1, then the losses of every logged step, against the no-SP run."
)


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{fnum(seconds * 1000)} ms"


def _ratio(a: float | None, b: float | None) -> str:
    return "" if a is None or not b else f" ({a / b:.2f}x)"


def _row(r: SpRow) -> list[object]:
    n = r.nosp
    return [
        code(r.run_name), esc(r.label), r.mode, f"{r.sp} x {r.dp}", esc(r.zero), esc(r.seq_length),
        _ms(r.iter_time) + (_ratio(r.iter_time, n.iter_time) if n else ""),
        fnum(r.tokens_per_s) + (_ratio(r.tokens_per_s, n.tokens_per_s) if n else ""),
        fmt_bytes(r.mem_peak) + (_ratio(r.mem_peak, n.mem_peak) if n else ""),
        _ms(n.iter_time) if n else "n/a", fnum(n.tokens_per_s) if n else "n/a",
        fmt_bytes(n.mem_peak) if n else "n/a", esc(n.source) if n else "none",
        bold(r.verdict), esc(r.evidence, 400),
    ]  # fmt: skip


def section(rows: Sequence[SpRow]) -> str:
    """The '## Sequence parallelism' section, or nothing when no run used it."""
    if not rows:
        return ""
    npass = sum(r.verdict == "PASS" for r in rows)
    checked = sum(r.verdict in ("PASS", "FAIL") for r in rows)
    head = ["run", "condition", "mode", "sp x dp", "ZeRO", "seq", "step time (vs no-SP)", "tokens/s (vs no-SP)",
            "peak memory (vs no-SP)", "no-SP step time", "no-SP tokens/s", "no-SP peak memory", "no-SP run",
            "verdict", "evidence"]  # fmt: skip
    return (
        "## Sequence parallelism\n\n" + INTRO + f" {npass} of {checked} checked runs PASS.\n\n"
        + table(head, [_row(r) for r in rows]) + "\n"
    )
