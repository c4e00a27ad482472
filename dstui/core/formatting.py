"""Number, memory and time formatting shared by the CLI, the report and the TUI.

One place so that a figure reads the same everywhere. Memory is binary:
bytes / 2**30 is a GiB and is labelled "GiB" (never "GB"); smaller amounts
use KiB / MiB. Unknown values print as "-" (what dstui does not know, it
does not invent).
"""

from __future__ import annotations

import math
from typing import Any

GIB = 1024**3
_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def fmt_bytes(n: Any, *, signed: bool = False) -> str:
    """Bytes with a binary unit: 512B, 1.5KiB, 46.6GiB; "-" for anything not a finite number."""
    if not _is_number(n):
        return "-"
    sign = ("+" if n >= 0 else "-") if signed else ("-" if n < 0 else "")
    x = float(abs(n))
    for unit in _BINARY_UNITS:
        if x < 1024 or unit == _BINARY_UNITS[-1]:
            return f"{sign}{x:.0f}{unit}" if unit == "B" else f"{sign}{x:.1f}{unit}"
        x /= 1024
    return "-"  # pragma: no cover - the loop always returns


def gib(n: Any) -> float | None:
    """Bytes -> GiB (bytes / 2**30), None when unknown."""
    return float(n) / GIB if _is_number(n) else None


def fmt_gib(n: Any, digits: int = 3) -> str:
    """Bytes as GiB with its unit: 50064946688 -> "46.627 GiB"; "-" when unknown."""
    g = gib(n)
    return "-" if g is None else f"{g:.{digits}f} GiB"


def fmt_num(x: Any, spec: str = ".4g") -> str:
    """A number with a format spec; "-" for anything else (None, text)."""
    return format(x, spec) if isinstance(x, (int, float)) and not isinstance(x, bool) else "-"


def fmt_sig(v: float) -> str:
    """Three significant digits, no scientific notation for everyday magnitudes."""
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.1f}"
    if a >= 10:
        return f"{v:.2f}"
    if a >= 0.01:
        return f"{v:.3f}"
    return f"{v:.2e}"


def fmt_interval(lo: float | None, hi: float | None, digits: int = 3) -> str:
    """An interval that cannot be misread: "[0.910, 1.050]" ("-" when there is none)."""
    if lo is None or hi is None:
        return "-"
    return f"[{lo:.{digits}f}, {hi:.{digits}f}]"
