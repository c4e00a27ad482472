"""How many charts a screen shows at once, so each stays legible (no textual here).

A braille chart needs about 10 rows and 45 columns to show a curve with its
axis labels; at 80x24 four charts in a 2x2 grid get 2-6 rows each. The live
view and the results charts ask :func:`charts_per_page` and page through the
rest with a key.
"""

from __future__ import annotations

WIDE = 100  # columns from which two charts fit side by side
TALL = 34  # rows from which two rows of charts fit (under a legend, above a log pane), 8+ rows each


def charts_per_page(width: int, height: int) -> int:
    """4 on a roomy terminal (e.g. 120x36), 2 when only one dimension is roomy, 1 at 80x24."""
    wide, tall = width >= WIDE, height >= TALL
    if wide and tall:
        return 4
    if wide or tall:
        return 2
    return 1


def grid_shape(per_page: int, width: int, height: int) -> tuple[int, int]:
    """(columns, rows) of the chart grid for ``per_page`` charts: side by side when wide, stacked when tall."""
    if per_page >= 4:
        return 2, 2
    if per_page == 2:
        return (2, 1) if width >= WIDE else (1, 2)
    return 1, 1
