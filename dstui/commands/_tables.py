"""The runs table people read: columns chosen by the terminal's width, reasons cut or shown whole.

At 80 columns the numbers that matter least go first (tok/s, ETA, iteration
time, ...) so the run, its state, its step and its reason stay on screen; a
reason that still does not fit is cut with "…" and shown whole, wrapped, under
the table with ``-v`` (run output is untrusted: control characters never reach
the terminal). `dstui run`'s progress lines use the same columns under a header.

``iter_s`` and ``tok/s`` are a finished run's means over its steps after warm-up
(:mod:`dstui.usecases.run_figures`, the report's figures), a live run's last
step; ``eta`` is the pace after warm-up times the steps to go.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dstui.commands._records import reason_of
from dstui.core import terminal
from dstui.core.formatting import fmt_bytes, fmt_num
from dstui.core.phases import live_text
from dstui.core.rundir import BatchDir, RunDir
from dstui.usecases import run_figures

MIN_REASON = 20  # the narrowest reason column; the numbers are dropped first
FALLBACK_WIDTH = 120  # not a terminal and no COLUMNS


def terminal_width() -> int:
    return max(40, shutil.get_terminal_size((FALLBACK_WIDTH, 24)).columns)


def printable(text: Any) -> str:
    """One line of text safe for a terminal (core.terminal: escape sequences and controls gone, breaks spaces)."""
    return terminal.printable(text, one_line=True)


def cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[dict[str, Any]], str]
    keep: int  # higher stays longer when the terminal is narrow; 99: never dropped


def _state(st: dict[str, Any]) -> str:
    state = st.get("state", "?")
    return f"{state} ({st['verdict']})" if st.get("verdict") else state


def _speed(st: dict[str, Any]) -> run_figures.Speed:
    return st.get("_speed") or run_figures.last_speed(st)


COLUMNS = (
    Column("run", lambda st: st.get("_name", "?"), 99),
    Column("state", _state, 99),
    Column("step", lambda st: f"{st.get('steps_done') or 0}/{st.get('steps_total') or '?'}", 99),
    Column("eta", lambda st: run_figures.eta_text(st, st.get("_warmup") or 0), 2),
    Column("loss", lambda st: fmt_num((st.get("last") or {}).get("loss")), 6),
    Column("iter_s", lambda st: fmt_num(_speed(st).iter_time, ".3f"), 3),
    Column("tok/s", lambda st: fmt_num(_speed(st).tokens_per_s, ".0f"), 1),
    Column("peak_mem", lambda st: fmt_bytes((st.get("last") or {}).get("mem_peak")), 5),
)


def backend_columns(b: BatchDir) -> tuple[Column, ...]:
    """The columns the batch's executor shows of its jobs (Slurm: job id, nodes)."""
    from dstui.usecases.watch import job_fields

    return tuple(Column(header, lambda st, f=field: str(st.get(f) or "-"), keep) for header, field, keep in job_fields(b))

REASON = "reason"


def _reason_or_phase(st: dict[str, Any]) -> str:
    """The reason; a verdict's evidence; for a live run without one, what it does now ('building op ShareMemComm 12s')."""
    return reason_of(st) or st.get("evidence") or live_text(st)


def shown_status(rd: RunDir, st: dict[str, Any] | None = None) -> dict[str, Any]:
    """A run's status with what the columns need besides it: its name, warm-up and speed figures."""
    st = rd.status() if st is None else st
    warmup = run_figures.warmup_of(rd.settings())
    return {**st, "_name": rd.name, "_warmup": warmup, "_speed": run_figures.speed(st, rd, warmup)}


def _statuses(runs: list[RunDir]) -> list[dict[str, Any]]:
    return [shown_status(rd) for rd in runs]


def choose(
    columns: tuple[Column, ...], statuses: list[dict[str, Any]], width: int, *, typical: dict[str, int] | None = None,
    reason_room: int | None = None,
) -> tuple[list[Column], list[int], int]:
    """The columns that fit ``width`` with room for a reason: (columns, their widths, the reason's width).

    ``typical``: widths to reserve for values not there yet (progress lines);
    ``reason_room``: the reason's room to keep (default: its longest, up to half the width).
    """
    cols = list(columns)
    cells = {c.header: [printable(c.cell(st)) for st in statuses] for c in cols}
    widths = {c.header: max([len(c.header), (typical or {}).get(c.header, 0), *map(len, cells[c.header])]) for c in cols}
    longest_reason = max([len(REASON), *(len(printable(_reason_or_phase(st))) for st in statuses)])
    want_reason = reason_room or min(longest_reason, max(MIN_REASON, width // 2))  # half a narrow screen

    def used() -> int:
        return sum(widths[c.header] + 2 for c in cols)

    while used() + want_reason > width:
        droppable = [c for c in cols if c.keep < 99]
        if not droppable:
            break
        cols.remove(min(droppable, key=lambda c: c.keep))
    room = width - used() if reason_room else min(longest_reason, width - used())
    return cols, [widths[c.header] for c in cols], max(MIN_REASON, room)


def render(b: BatchDir, *, width: int | None = None, verbose: bool = False) -> str:
    """The batch's runs as a table that fits ``width``; with ``verbose`` every reason whole below it."""
    width = width or terminal_width()
    runs = b.runs()
    statuses = _statuses(runs)
    columns = COLUMNS + backend_columns(b)
    cols, widths, reason_w = choose(columns, statuses, width)
    lines = ["  ".join(c.header.ljust(w) for c, w in zip(cols, widths, strict=True)) + "  " + REASON]
    was_cut = []
    for st in statuses:
        reason = printable(_reason_or_phase(st))
        if len(reason) > reason_w and reason_of(st):
            was_cut.append(st)
        row = [printable(c.cell(st)).ljust(w) for c, w in zip(cols, widths, strict=True)]
        lines.append(("  ".join(row) + "  " + cut(reason, reason_w)).rstrip())
    if verbose:
        lines += full_reasons(statuses, width, every=True)
    elif was_cut:
        lines.append(f"({len(was_cut)} reason(s) cut to fit {width} columns; -v shows them whole)")
    return "\n".join(lines)


def full_reasons(statuses: list[dict[str, Any]], width: int, *, every: bool = False) -> list[str]:
    """Each reason whole, wrapped to ``width``: every run's with ``every``, else the failed and killed ones."""
    out = []
    for st in statuses:
        reason = reason_of(st)
        if not reason or not (every or st.get("state") in ("failed", "killed")):
            continue
        out.append(textwrap.fill(printable(reason), width=width, initial_indent=f"  {st['_name']}: ",
                                 subsequent_indent="      ", break_on_hyphens=False))  # fmt: skip
    if out:
        out.insert(0, "reasons:")
    return out


def failure_reasons(b: BatchDir, width: int | None = None) -> str:
    """The failed and killed runs' reasons whole (`dstui run`'s ending: the outcome must be read in full)."""
    return "\n".join(full_reasons(_statuses(b.runs()), width or terminal_width()))


class ProgressLines:
    """`dstui run`'s progress: a header, then one aligned line per change (columns fixed for the batch)."""

    def __init__(self, b: BatchDir, width: int | None = None) -> None:
        self.width = width or terminal_width()
        names = [rd.name for rd in b.runs()]
        totals = [len(str(rd.status().get("steps_total") or "?")) for rd in b.runs()]
        sample = [{"_name": n, "state": "starting", "steps_total": 10 ** max(totals or [1])} for n in names] or [{}]
        # room for what a run prints later (loss 0.1234, peak 150.3KiB), and for a reason
        typical = {"eta": 4, "loss": 6, "iter_s": 6, "tok/s": 6, "peak_mem": 8}
        room = max(MIN_REASON, min(36, self.width // 2))
        self.cols, self.widths, self.reason_w = choose(COLUMNS, sample, self.width, typical=typical, reason_room=room)
        self.header_shown = False

    def header(self) -> str:
        return "  ".join(c.header.ljust(w) for c, w in zip(self.cols, self.widths, strict=True)) + "  " + REASON

    def line(self, rd: RunDir, st: dict[str, Any] | None = None) -> str:
        st = shown_status(rd, st)
        row = [printable(c.cell(st)).ljust(w) for c, w in zip(self.cols, self.widths, strict=True)]
        return ("  ".join(row) + "  " + cut(printable(_reason_or_phase(st)), self.reason_w)).rstrip()

    def lines(self, rd: RunDir, st: dict[str, Any] | None = None) -> list[str]:
        """The line of a run, after the header the first time."""
        out = [] if self.header_shown else [self.header()]
        self.header_shown = True
        return [*out, self.line(rd, st)]
