"""A verify verdict with its evidence, in one line: what `dstui status`, the TUI, MLflow and reports show.

The parity runner's summary record (runners/parity_session.py) carries the
numbers that decided the verdict: the gradient-norm ratio of every step, the
shape of the first diverging step's gradient error (uniform scale 0.25 =
1/GAS, rank-local, micro-batch k dropped, rounding-level, ...) and the margin
(the largest difference divided by its tolerance). A FAIL and a PASS both say
them, so "FAIL" for a 65536x error and for a rounding difference can no longer
read alike. The summary comes from a run's own output: every text is cut and
stripped of control characters here.
"""

from __future__ import annotations

import math
from typing import Any

MAX_SHAPE = 200


def _text(value: Any, limit: int = MAX_SHAPE) -> str:
    text = "".join(ch if ch.isprintable() else " " for ch in str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def ratio_range(summary: dict[str, Any]) -> tuple[float, float, int] | None:
    """(smallest, largest, steps) of the per-step grad-norm ratios; None when the summary has none."""
    ratios = summary.get("grad_norm_ratios")
    if not isinstance(ratios, list):
        return None
    values = [v for v in (_number(r) for r in ratios[:100_000]) if v is not None]
    return (min(values), max(values), len(values)) if values else None


def _fixed(x: float, places: int) -> str:
    """Fixed point for the numbers a verdict shows; exponent form past a million (1e250 in fixed point is 250 digits)."""
    return f"{x:.{places}f}" if abs(x) < 1e6 else f"{x:.3e}"


def evidence(summary: dict[str, Any]) -> str | None:
    """'verify FAIL at step 1: grad-norm ratio 0.2500, uniform scale 0.2500 = 1/GAS ...', or the PASS's numbers.

    None when the summary is not a parity verdict; the plain old reason when the runner
    wrote no shape (a bundled runner before issue 37, or another program).
    """
    verdict = summary.get("verdict")
    if verdict not in ("PASS", "FAIL") or summary.get("check"):
        return None
    shape = summary.get("grad_shape")
    step = summary.get("first_diverging_step")
    if verdict == "FAIL":
        if not shape:
            return f"verify FAIL (first diverging step {_text(step, 12)})"
        return f"verify FAIL at step {_text(step, 12)}: {_text(shape)}"
    parts = []
    span = ratio_range(summary)
    if span:
        lo, hi, n = span
        parts.append(f"grad-norm ratio {_fixed(lo, 4)}" + (f"..{_fixed(hi, 4)}" if hi != lo else "") + f" over {n} steps")
    margin = _number(summary.get("margin_max"))
    if margin is not None:
        parts.append("bit-exact" if margin == 0 else f"largest difference {_fixed(margin, 2)}x its tolerance")
    return "verify PASS" + (": " + ", ".join(parts) if parts else "")
