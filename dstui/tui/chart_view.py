"""What a chart shows of its curves, decided without textual: range, scale, warm-up, coinciding runs.

:func:`plan` is the one place these rules live, for the live view and the
results charts alike:

* **y-range from the steps after warm-up**: a curve's first ``warmup`` steps
  (compile, allocator growth) can be 50x a normal step; the axis is set from
  the points after them so the steady state stays readable (the warm-up
  points that fall outside are clipped and the title says so). When a curve
  has nothing after its warm-up yet, all of its points count. Loss curves
  (``range_skips_warmup=False``) keep their first steps in the range.
* **hide warm-up** drops those steps from the drawing altogether.
* **log scale** sets the range from the positive values only.
* **coinciding curves**: runs with identical values (deterministic repeats)
  would draw one over the other and hide all but the last. Curves with the
  same points are grouped; the first of a group is drawn as a line and every
  other one as a distinct marker glyph spread along it, and the plan carries a
  note ("2 runs identical") for the title.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

# glyphs for the 2nd, 3rd, ... curve of a coinciding group (the 1st is the line)
MARKERS = ("x", "+", "o", "*", "#", "%", "@")


@dataclass
class Curve:
    label: str
    index: int  # colour index (the run's position in the view)
    x: Sequence[float]
    y: Sequence[float]
    raw: bool = False  # drawn dimmed, under a smoothed twin
    warmup: float = 0.0  # points with x <= warmup are warm-up steps (0: none)
    # whether the warm-up steps are left out of the y-range: yes for timings (a compile spike is an
    # artefact), no for loss (its first steps are real values the chart must keep)
    range_skips_warmup: bool = True


@dataclass
class ViewOptions:
    log_y: bool = False
    hide_warmup: bool = False


@dataclass(frozen=True)
class Drawn:
    """How one curve is drawn: ``marker`` is "line" or a glyph; ``same_as`` the label it coincides with."""

    label: str
    index: int
    marker: str = "line"
    same_as: str | None = None
    slot: int = 0  # position in its coinciding group (spreads the markers)
    slots: int = 1


@dataclass
class Plan:
    curves: list[Curve] = field(default_factory=list)  # after hiding warm-up
    drawn: list[Drawn] = field(default_factory=list)  # one per curve, same order
    y_limits: tuple[float, float] | None = None  # data units
    warmup_clipped: bool = False
    groups: list[list[str]] = field(default_factory=list)  # labels of curves that coincide (2+ each)

    @property
    def note(self) -> str:
        if not self.groups:
            return ""
        n = sum(len(g) for g in self.groups)
        if len(self.groups) == 1:
            return f"{n} runs identical"
        return f"{n} runs in {len(self.groups)} identical groups"


def plan(curves: Sequence[Curve], options: ViewOptions) -> Plan:
    """Decide the range and the markers of ``curves`` under ``options`` (see the module docstring)."""
    import numpy as np

    shown: list[Curve] = []
    for c in curves:
        if options.hide_warmup and c.warmup > 0 and len(c.x):
            x = np.asarray(c.x, dtype=float)
            keep = x > c.warmup
            if not keep.all():
                y = np.asarray(c.y, dtype=float)
                c = replace(c, x=x[keep].tolist(), y=y[keep].tolist())
        shown.append(c)
    out = Plan(curves=shown)
    out.drawn, out.groups = _coinciding(shown)
    out.y_limits, out.warmup_clipped = _y_limits(shown, options.log_y)
    return out


def _coinciding(curves: Sequence[Curve]) -> tuple[list[Drawn], list[list[str]]]:
    """Group non-raw curves with the same points; the first of a group is the line."""
    import numpy as np

    by_key: dict[tuple, list[int]] = {}
    for i, c in enumerate(curves):
        if c.raw or not len(c.x):
            continue
        x = np.asarray(c.x, dtype=float)
        y = np.asarray(c.y, dtype=float)
        key = (len(x), x.tobytes(), np.round(y, 12).tobytes())
        by_key.setdefault(key, []).append(i)
    drawn = [Drawn(c.label, c.index) for c in curves]
    groups: list[list[str]] = []
    for members in by_key.values():
        if len(members) < 2:
            continue
        first = curves[members[0]].label
        groups.append([curves[m].label for m in members])
        for slot, m in enumerate(members[1:], start=1):
            c = curves[m]
            drawn[m] = Drawn(c.label, c.index, MARKERS[(slot - 1) % len(MARKERS)], first, slot, len(members))
    return drawn, groups


def _y_limits(curves: Sequence[Curve], log: bool) -> tuple[tuple[float, float] | None, bool]:
    """(lo, hi) over the points after each curve's warm-up, padded 5% (not below 0 for data that is never
    negative); and whether warm-up points fall outside."""
    import numpy as np

    steady: list = []
    warm: list = []
    for c in curves:
        if not len(c.x):
            continue
        x = np.asarray(c.x, dtype=float)
        y = np.asarray(c.y, dtype=float)
        after = x > c.warmup if c.range_skips_warmup else np.ones(len(x), dtype=bool)
        if after.any():
            steady.append(y[after])
            warm.append(y[~after])
        else:
            steady.append(y)
    if not steady:
        return None, False
    ys = np.concatenate(steady)
    ys = ys[np.isfinite(ys)]
    if log:
        ys = ys[ys > 0]
    if not len(ys):
        return None, False
    lo, hi = float(ys.min()), float(ys.max())
    if log:
        llo, lhi = np.log10(lo), np.log10(hi)
        pad = (lhi - llo) * 0.05 or 0.05
        lim = (float(10 ** (llo - pad)), float(10 ** (lhi + pad)))
    else:
        pad = (hi - lo) * 0.05 or (abs(hi) * 0.05 or 1.0)
        # times, rates and memory cannot go below 0: padding must not draw an axis that suggests they can
        lim = (max(lo - pad, 0.0) if lo >= 0 else lo - pad, hi + pad)
    clipped = False
    if warm:
        w = np.concatenate(warm)
        w = w[np.isfinite(w)]
        clipped = bool(len(w) and ((w > lim[1]).any() or (w < lim[0]).any()))
    return lim, clipped
