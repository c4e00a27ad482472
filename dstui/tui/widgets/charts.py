"""Live charts: a PlotextPlot that draws only data handed to it, decimated to its width.

Data arrives via :meth:`MetricPlot.set_curves` (main thread, from the live
view's messages); the plot is rebuilt lazily in :meth:`render` and only when
the data or the size changed. Each plot uses its own ``self.plt``, never the
module-global plotext (which is not safe across threads).

What a plot decides from its curves (see :mod:`dstui.tui.chart_view`, no textual):
the y-range from the steps after each curve's warm-up (a first step's compile
spike must not flatten the rest), an optional log scale, hiding the warm-up
steps, and which curves coincide (drawn once as a line, the others as distinct
markers on it, with a note in the title), so no run is hidden under another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.app import RenderResult
from textual_plotext import PlotextPlot

from dstui.tui.chart_view import Curve, Drawn, ViewOptions, plan
from dstui.tui.series import decimate

__all__ = ["PALETTE", "MetricPlot", "color", "dim"]

# Distinct, readable on dark and light themes; raw curves use the dim twin.
PALETTE: list[tuple[int, int, int]] = [
    (86, 156, 214), (229, 139, 62), (106, 190, 106), (220, 90, 90),
    (170, 130, 220), (200, 180, 80), (90, 200, 200), (220, 120, 180),
]  # fmt: skip


def color(i: int) -> tuple[int, int, int]:
    return PALETTE[i % len(PALETTE)]


def dim(rgb: tuple[int, int, int]) -> tuple[int, int, int]:
    return tuple(int(c * 0.45 + 60 * 0.55) for c in rgb)  # type: ignore[return-value]


@dataclass
class _Options:
    log_y: bool = False
    hide_warmup: bool = False


class MetricPlot(PlotextPlot):
    """One metric of several runs against step (or time)."""

    DEFAULT_CSS = """
    MetricPlot { height: 1fr; width: 1fr; min-height: 6; }
    """

    def __init__(self, title: str, *, xlabel: str = "step", id: str | None = None) -> None:
        super().__init__(id=id)
        self.title = title
        self.xlabel = xlabel
        self.scale = 1.0
        self.unit = ""
        self.options = ViewOptions()
        self._curves: list[Curve] = []
        self._built_for: tuple | None = None
        self._cache: RenderResult = Text("")
        self._version = 0
        self._empty_text = "waiting for data"
        self.view = plan([], self.options)

    def set_curves(self, curves: list[Curve], *, scale: float = 1.0, unit: str = "", title: str | None = None) -> None:
        self._curves = curves
        self.scale = scale
        self.unit = unit
        if title is not None:
            self.title = title
        self._replan()

    def set_options(self, *, log_y: bool | None = None, hide_warmup: bool | None = None) -> None:
        """Log scale / hide warm-up: the plan (y-range, groups) is recomputed from the same curves."""
        if log_y is not None:
            self.options.log_y = log_y
        if hide_warmup is not None:
            self.options.hide_warmup = hide_warmup
        self._replan()

    def set_empty(self, text: str) -> None:
        self._empty_text = text
        self._curves = []
        self.unit = ""
        self._replan()

    def _replan(self) -> None:
        self.view = plan(self._curves, self.options)
        self._version += 1
        self.refresh()

    # -- what the plot shows (tests and the legend read these) --------------------

    @property
    def point_count(self) -> int:
        return sum(len(c.x) for c in self._curves)

    @property
    def y_limits(self) -> tuple[float, float] | None:
        """The y-axis range in the plot's display unit (data / scale), or None while empty."""
        lim = self.view.y_limits
        return None if lim is None else (lim[0] / self.scale, lim[1] / self.scale)

    @property
    def y_scale(self) -> str:
        return "log" if self.options.log_y else "linear"

    @property
    def drawn(self) -> list[Drawn]:
        """One entry per curve: its label, and the marker it is drawn with (line or a distinct glyph)."""
        return self.view.drawn

    @property
    def full_title(self) -> str:
        return self.title_for(10_000)

    def title_for(self, width: int) -> str:
        """The title with its unit, view tags and coinciding note, shortened to fit ``width``
        (plotext drops a title that does not fit; the identical-runs note is kept longest)."""
        tags = []
        if self.options.log_y:
            tags.append("log")
        if self.options.hide_warmup:
            tags.append("no warm-up")
        elif self.view.warmup_clipped:
            tags.append("warm-up off scale")
        note = self.view.note
        base = self.title + (f" [{self.unit}]" if self.unit else "")
        short_note = note.replace(" runs identical", " identical").replace(" runs in ", " in ")
        short_tags = [{"warm-up off scale": "warm-up ↑", "no warm-up": "-warm-up"}.get(t, t) for t in tags]
        for t, n in ((tags, note), (short_tags, note), (short_tags, short_note), ([], short_note), ([], "")):
            text = base + (" (" + ", ".join(t) + ")" if t else "") + (" · " + n if n else "")
            if len(text) <= width:
                return text
        return base[: max(1, width)]

    # -- drawing ----------------------------------------------------------------------

    def _build(self) -> None:
        import math

        plt = self.plt
        plt.clear_figure()
        # braille: 2 dots per cell across; the y-axis labels take ~8 columns
        columns = max(10, (self.size.width - 8) * 2)
        # plotext centres the title on the canvas (right of the y labels) and drops one that overflows
        plt.title(self.title_for(self.size.width - 12))
        drawn = False
        log = self.options.log_y
        pairs = list(zip(self.view.curves, self.view.drawn, strict=True))
        # lines first, then the markers of coinciding curves on top (a later line must not hide them)
        pairs.sort(key=lambda p: p[1].marker != "line")
        for c, d in pairs:
            if not len(c.x):
                continue
            xs, ys = decimate(c.x, c.y, columns)
            if self.scale != 1.0:
                ys = [v / self.scale for v in ys]
            if log:
                keep = [i for i, v in enumerate(ys) if v > 0]
                xs, ys = [xs[i] for i in keep], [ys[i] for i in keep]
                if not xs:
                    continue
            rgb = dim(color(c.index)) if c.raw else color(c.index)
            if d.marker != "line":
                mx, my = _spread_marks(xs, ys, d.slot, d.slots, max(4, self.size.width // 8))
                if self.y_limits is not None:
                    my = _on_braille_rows(my, self.y_limits, self.size.height - CANVAS_MARGIN, log)
                plt.scatter(mx, my, marker=d.marker, color=rgb)
            elif len(xs) < len(c.x):
                # decimated: the per-column min/max as dots. plotext interpolates every
                # line segment dot by dot, which for a noisy envelope costs ~50x more.
                plt.scatter(xs, ys, marker="braille", color=rgb)
            else:
                plt.plot(xs, ys, marker="braille", color=rgb)
            drawn = True
        lim = self.y_limits
        if drawn and lim is not None:
            if log:
                plt.yscale("log")
                plt.ylim(math.log10(lim[0]), math.log10(lim[1]))
            else:
                plt.ylim(*lim)
                plt.yticks(row_ticks(lim, self.size.height - CANVAS_MARGIN))
        if not drawn:
            plt.text(self._empty_text, 0.5, 0.5, alignment="center")
            plt.xlim(0, 1)
            plt.ylim(0, 1)
            plt.xticks([])
            plt.yticks([])
        plt.xlabel(self.xlabel if drawn else "")

    def render(self) -> RenderResult:
        key = (self._version, self.size.width, self.size.height, self.app.theme)
        if key != self._built_for:
            self._build()
            self._built_for = key
            self._cache = super().render()
        if self.size.width < 12 or self.size.height < 4:
            return Text(self.title)
        return self._cache


CANVAS_MARGIN = 5  # rows of a plot that are not its canvas: title, the two axis lines, x ticks, x label
Y_TICKS = 7  # plotext's own count of y ticks on a tall chart


def row_ticks(lim: tuple[float, float], rows: int) -> list[float]:
    """Y ticks for a canvas of ``rows`` text rows: at most one per row, each exactly on a row, evenly spread
    (4 to 7 of them at even steps where the rows divide, else 7 as even as rounding gets).

    plotext puts its 7 ticks at the nearest row: on a 6-row chart two fall on one row and one
    label is lost, so the axis read 4.17, 2.57 with 3.37 gone (issue 38.3).
    """
    lo, hi = lim
    if rows < 2 or not hi > lo:
        return [lo, hi]
    # evenly spaced where the rows allow it (11 rows: 6 ticks, every other row), else as even as rounding gets
    even = [n for n in range(min(Y_TICKS, rows), 3, -1) if (rows - 1) % (n - 1) == 0]
    n = even[0] if even else min(Y_TICKS, rows)
    picked = sorted({round(i * (rows - 1) / (n - 1)) for i in range(n)})
    return [lo + (hi - lo) * r / (rows - 1) for r in picked]


def _spread_marks(
    xs: Sequence[float], ys: Sequence[float], slot: int, slots: int, count: int
) -> tuple[list[float], list[float]]:
    """``count`` points of a curve, evenly spread, shifted by ``slot`` of ``slots`` so the markers of
    curves that coincide land on different places along the same line."""
    n = len(xs)
    if n == 0:
        return [], []
    stride = max(1, n // max(1, count))
    offset = (stride * slot) // max(1, slots)
    idx = list(range(min(offset, n - 1), n, stride))
    return [xs[i] for i in idx], [ys[i] for i in idx]


def _on_braille_rows(ys: Sequence[float], lim: tuple[float, float], rows: int, log: bool) -> list[float]:
    """Marker values moved to the text row where plotext draws the braille line through the same value.

    plotext maps a value to ``floor(0.5 + (bins - 1) * f)``, with 4 bins per row for braille and 1
    for a glyph, so a glyph on the same value can land a row away from the line it marks. ``rows`` is
    the canvas height (the widget less title, x ticks, x label and the two axis lines).
    """
    import math

    if rows < 2:
        return list(ys)
    lo, hi = (math.log10(lim[0]), math.log10(lim[1])) if log else lim
    if hi <= lo:
        return list(ys)
    out = []
    for y in ys:
        v = math.log10(y) if log and y > 0 else y
        f = (v - lo) / (hi - lo)
        row = math.floor(round(0.5 + (4 * rows - 1) * f, 8)) // 4
        snapped = lo + (hi - lo) * row / (rows - 1)
        out.append(10**snapped if log else snapped)
    return out
