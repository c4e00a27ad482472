"""Small output helpers shared by the headless commands."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

from dstui.commands import _argtypes
from dstui.core.rundir import BatchDir, RunDir

__all__ = ["add_run_refs", "find_runs", "fitted_table", "runs_table", "table"]


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=False)).rstrip()]
    for row in rows:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)).rstrip())
    return "\n".join(lines)


def fitted_table(rows: list[list[str]], header: list[str], width: int, *, drop_first: Sequence[str] = ()) -> str:
    """:func:`table` within ``width`` columns, saying what it moved or left out; never a line the terminal wraps.

    A wrapped table puts half a value on the next line, where it reads as
    another row's. So, while the table is too wide: columns with one value for
    every row move to one line under it ("the same for every run: dtype bf16,
    ..."), then the columns of ``drop_first`` go, in that order, each named in
    a note (``--json`` has everything).
    """
    header, rows = list(header), [list(r) for r in rows]

    def wide() -> bool:
        return max(len(line) for line in table(rows, header).split("\n")) > width

    def take(i: int) -> None:
        del header[i]
        for r in rows:
            del r[i]

    same: list[str] = []
    if wide() and len(rows) > 1:
        for name in [h for h in header if h not in ("#", "run")]:
            i = header.index(name)
            if len({r[i] for r in rows}) == 1:
                same.append(f"{name} {rows[0][i]}")
                take(i)
    left_out = []
    for name in drop_first:
        if not wide():
            break
        if name in header:
            take(header.index(name))
            left_out.append(name)
    out = [table(rows, header)]
    if same:
        out.append(textwrap.fill("the same for every run: " + ", ".join(same), width=width, subsequent_indent="  "))
    if left_out:
        out.append(textwrap.fill(f"left out to fit {width} columns: {', '.join(left_out)} (--json has every field)",
                                 width=width, subsequent_indent="  "))  # fmt: skip
    return "\n".join(out)


def runs_table(b: BatchDir, *, width: int | None = None, verbose: bool = False) -> str:
    """The batch's runs, columns fitted to the terminal (Slurm batches add job id and nodes); see _tables."""
    from dstui.commands import _tables

    return _tables.render(b, width=width, verbose=verbose)


def add_run_refs(p: Any, *, what: str = "run") -> None:
    p.add_argument(
        "runs", nargs="+", metavar="REF", type=_argtypes.reference,
        help=f"what to {what}: a batch id (all its runs), a run name (newest batch that has it), BATCH/RUN, "
        "a run or batch folder; shell patterns match batch ids and run names (e.g. 'smoke-*', 'smoke-*/z3-*', 'z1-*')",
    )  # fmt: skip


def find_runs(refs: list[str]) -> list[RunDir]:
    """Every run the references name, in order, once each; NotFound (exit 3) naming the first that names none."""
    from dstui.commands._select import select_runs

    return select_runs(refs)
