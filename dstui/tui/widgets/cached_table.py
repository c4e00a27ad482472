"""A DataTable that remembers its rows' cells and sends only the cells that changed.

The runs screen rebuilds every row from each snapshot of the run folders;
redrawing a whole table that often flickers and costs CPU on a long batch, so a
row whose key set is unchanged is patched cell by cell instead. When the table
starts showing something else (another batch), :meth:`reset` drops the columns'
widths too: DataTable only ever widens a column, and it cuts a cell to its
column without "…" (issue 38.3: ``20/2`` for ``20/20`` after another batch).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from textual.widgets import DataTable


class CachedTable(DataTable):
    """``sync(rows)`` makes the table show ``rows`` (key, cells) with as few updates as it can."""

    def __init__(self, columns: Sequence[str], **kwargs) -> None:  # noqa: ANN003 - DataTable's own arguments
        super().__init__(**kwargs)
        self.labels = tuple(columns)
        self.cells: dict[str, tuple] = {}
        self.shown_for: object = None  # what the rows are of (the runs table: a batch id)

    def on_mount(self) -> None:
        self.add_columns(*self.labels)

    def reset(self, shown_for: object) -> None:
        """Empty, with columns as wide as their labels: the next rows size them afresh."""
        self.clear(columns=True)
        self.add_columns(*self.labels)
        self.cells = {}
        self.shown_for = shown_for

    def sync(self, rows: Iterable[tuple[str, tuple]]) -> bool:
        """Show these rows; True when the table was rebuilt (other keys or another order)."""
        rows = list(rows)
        if [k for k, _ in rows] != list(self.cells):
            self.clear()
            self.cells = {}
            for key, cells in rows:
                self.add_row(*cells, key=key)
                self.cells[key] = cells
            return True
        for key, cells in rows:
            self.update_row(key, cells)
        return False

    def update_row(self, key: str, cells: tuple) -> None:
        """Patch the cells of one row that differ from what it shows.

        A column widens to fit a longer value (a reason that appears when a run fails, the
        GPUs a run gets when it starts): the widths set when the rows were added would cut it.
        """
        old = self.cells.get(key)
        if old == cells:
            return
        for i, (a, b) in enumerate(zip(old or (), cells, strict=False)):
            if a != b:
                self.update_cell(key, self.ordered_columns[i].key, b, update_width=True)
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
