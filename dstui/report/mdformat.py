"""Markdown formatting helpers of the report: tables and number cells."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dstui.core.formatting import fmt_sig

if TYPE_CHECKING:  # pragma: no cover
    from dstui.analysis.runs import ConditionStats
    from dstui.report.context import ReportContext

# params that name a run rather than set it up: never "settings that differ"
IDENTITY_PARAMS = frozenset({"seed", "nvme_path", "hung_after_s", "run_key", "revision", "repeat"})


def img(ctx: ReportContext, key: str, alt: str) -> str:
    """A markdown image line for a chart drawn into the report folder ('' when not drawn)."""
    return f"![{alt}]({ctx.images[key]})\n" if key in ctx.images else ""


def table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(cell(h) for h in head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(out)


def fnum(v: float | None, digits: int | None = None) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return f"{v:.{digits}f}" if digits is not None else fmt_sig(v)


def fexp(v: float | None) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    return f"{v:.3e}"


def pm(mean: str, std: str | None) -> str:
    return mean if std is None or mean == "n/a" else f"{mean} ± {std}"


def marker(c: ConditionStats) -> str:
    if c.n_usable:
        return "no data"
    if c.n_oom:
        return "OOM"
    if c.n_failed:
        return "failed"
    return c.statuses or "no data"
