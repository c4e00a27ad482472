"""Live charts: a PlotextPlot that draws only data handed to it, decimated to its width.

Data arrives via :meth:`MetricPlot.set_curves` (main thread, from the live
view's messages); the plot is rebuilt lazily in :meth:`render` and only when
the data or the size changed. Each plot uses its own ``self.plt``, never the
module-global plotext (which is not safe across threads).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.app import RenderResult
from textual_plotext import PlotextPlot

from dstui.tui.series import decimate

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
class Curve:
    label: str
    index: int  # colour index (the run's position in the view)
    x: Sequence[float]
    y: Sequence[float]
    raw: bool = False  # drawn dimmed, under a smoothed twin


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
        self._curves: list[Curve] = []
        self._built_for: tuple | None = None
        self._cache: RenderResult = Text("")
        self._version = 0
        self._empty_text = "waiting for data"

    def set_curves(self, curves: list[Curve], *, scale: float = 1.0, unit: str = "", title: str | None = None) -> None:
        self._curves = curves
        self.scale = scale
        self.unit = unit
        if title is not None:
            self.title = title
        self._version += 1
        self.refresh()

    def set_empty(self, text: str) -> None:
        self._empty_text = text
        self._curves = []
        self.unit = ""
        self._version += 1
        self.refresh()

    @property
    def point_count(self) -> int:
        return sum(len(c.x) for c in self._curves)

    def _build(self) -> None:
        plt = self.plt
        plt.clear_figure()
        # braille: 2 dots per cell across; the y-axis labels take ~8 columns
        columns = max(10, (self.size.width - 8) * 2)
        title = self.title + (f" [{self.unit}]" if self.unit else "")
        plt.title(title)
        drawn = False
        for c in self._curves:
            if not len(c.x):
                continue
            xs, ys = decimate(c.x, c.y, columns)
            if self.scale != 1.0:
                ys = [v / self.scale for v in ys]
            rgb = dim(color(c.index)) if c.raw else color(c.index)
            if len(xs) < len(c.x):
                # decimated: the per-column min/max as dots. plotext interpolates every
                # line segment dot by dot, which for a noisy envelope costs ~50x more.
                plt.scatter(xs, ys, marker="braille", color=rgb)
            else:
                plt.plot(xs, ys, marker="braille", color=rgb)
            drawn = True
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
