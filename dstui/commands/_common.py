"""Small output helpers shared by the headless commands."""

from __future__ import annotations

from typing import Any

from dstui.core.formatting import eta, fmt_bytes, fmt_num
from dstui.core.rundir import BatchDir, RunDir

__all__ = ["add_run_refs", "eta", "find_runs", "fmt_bytes", "fmt_num", "runs_table", "table"]


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=False)).rstrip()]
    for row in rows:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)).rstrip())
    return "\n".join(lines)


def runs_table(b: BatchDir, *, width: int | None = None, verbose: bool = False) -> str:
    """The batch's runs, columns fitted to the terminal (Slurm batches add job id and nodes); see _tables."""
    from dstui.commands import _tables

    return _tables.render(b, width=width, verbose=verbose)


def add_run_refs(p: Any, *, what: str = "run") -> None:
    p.add_argument(
        "runs", nargs="+", metavar="REF",
        help=f"what to {what}: a batch id (all its runs), a run name (newest batch that has it), BATCH/RUN, "
        "a run or batch folder; shell patterns match batch ids and run names (e.g. 'smoke-*', 'smoke-*/z3-*', 'z1-*')",
    )  # fmt: skip


def find_runs(refs: list[str]) -> list[RunDir]:
    """Every run the references name, in order, once each; NotFound (exit 3) naming the first that names none."""
    from dstui.commands._select import select_runs

    return select_runs(refs)


LOW_SPACE_BYTES = 16 << 20


def batch_notes(info: dict[str, Any], path: Any = None) -> list[str]:
    """Problems of a batch a person must hear about once: store lost or down, disk full."""
    import shutil

    notes = [info[k] for k in ("tracking_problem", "tracking_note", "supervisor_problem", "creation_problem") if info.get(k)]
    if path is not None:
        try:
            free = shutil.disk_usage(path).free
        except OSError:
            free = None
        if free is not None and free < LOW_SPACE_BYTES:
            notes.append(f"disk full: {free / 2**20:.1f} MiB free where the runs are ({path})")
    return notes
