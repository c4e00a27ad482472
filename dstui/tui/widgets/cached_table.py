"""A DataTable that remembers its rows' cells, sends only the cells that changed, and sizes its own columns.

The runs screen rebuilds every row from each snapshot of the run folders;
redrawing a whole table that often flickers and costs CPU on a long batch, so a
row whose key set is unchanged is patched cell by cell instead.

Column widths are the table's own (the widest cell, or the label), set when a
row is added or a cell changes width: DataTable's automatic widths are measured
later, when the app is idle, and a frame drawn before that keeps the old widths
(its line caches are not cleared when the widths change), cutting cells without
"…" (issue 38.3: ``20/2`` for ``20/20``, ``base-ol`` for a longer run name, after
Live, Escape and another batch; ``a-r`` for ``a-r0`` on a first frame).

Every cell is shown as text, never as markup: a run's name or reason is the
run's own (``[/x]`` in a reason would otherwise stop the table from drawing).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.text import Text
from textual.widgets import DataTable


def as_text(cell: object) -> Text:
    """A cell as DataTable should draw it: a Text as it is; anything else literally (no markup)."""
    return cell if isinstance(cell, Text) else Text(str(cell), end="")


class CachedTable(DataTable):
    """``sync(rows)`` makes the table show ``rows`` (key, cells) with as few updates as it can."""

    def __init__(self, columns: Sequence[str], **kwargs) -> None:  # noqa: ANN003 - DataTable's own arguments
        super().__init__(**kwargs)
        self.labels = tuple(columns)
        self.cells: dict[str, tuple] = {}  # what each row shows, as given (tests and screens read these)
        self.widths: tuple[int, ...] = ()  # the columns' widths now

    def on_mount(self) -> None:
        self._rebuild([], self._widths_for([]))

    def _widths_for(self, rows: list[tuple[str, tuple]]) -> tuple[int, ...]:
        widths = [len(label) for label in self.labels]
        for _, cells in rows:
            for i, cell in enumerate(cells[: len(widths)]):
                widths[i] = max(widths[i], as_text(cell).cell_len)
        return tuple(widths)

    def _rebuild(self, rows: list[tuple[str, tuple]], widths: tuple[int, ...]) -> None:
        """Every row again (and the columns when their widths change: the screen's layout then changes
        too, the dearest redraw); the cursor stays on its row (no highlight event for it)."""
        keep = self.cursor_key()
        with self.prevent(DataTable.RowHighlighted, DataTable.CellHighlighted):
            if widths != self.widths or not self.columns:
                self.clear(columns=True)
                for label, width in zip(self.labels, widths, strict=True):
                    self.add_column(label, width=width)
            else:
                self.clear()
            self.cells = {}
            for key, cells in rows:
                self.add_row(*map(as_text, cells), key=key)
                self.cells[key] = cells
            self.widths = widths
            if keep is not None:
                self.move_to(keep)

    def sync(self, rows: Iterable[tuple[str, tuple]]) -> bool:
        """Show these rows; True when the table was rebuilt (other keys, another order, other widths)."""
        rows = list(rows)
        widths = self._widths_for(rows)
        if [k for k, _ in rows] != list(self.cells) or widths != self.widths:
            self._rebuild(rows, widths)
            return True
        for key, cells in rows:
            self.update_row(key, cells)
        return False

    def update_row(self, key: str, cells: tuple) -> None:
        """Patch the cells of one row that differ from what it shows (their widths fit: sync checked)."""
        old = self.cells.get(key)
        if old == cells:
            return
        for i, (a, b) in enumerate(zip(old or (), cells, strict=False)):
            if a != b:
                self.update_cell(key, self.ordered_columns[i].key, as_text(b))
        self.cells[key] = cells

    def cursor_key(self) -> str | None:
        """The key of the row under the cursor, None in an empty table."""
        if self.row_count == 0:
            return None
        try:
            key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except Exception:
            return None
        return str(key) if key else None

    def move_to(self, key: str) -> None:
        """Put the cursor on the row with this key (no animation), if there is one."""
        if key in self.cells:
            self.move_cursor(row=list(self.cells).index(key), animate=False)
