"""The cells of the runs screen's two tables, from a snapshot's views (pure: no I/O, cheap to compare).

A row is rebuilt from a run's status (as the snapshot holds it) on every tick;
only cells that changed are sent to the table, so rows must compare equal when
nothing moved. ``iter s`` and ``tok/s`` are a finished run's means after
warm-up (the report's figures); a live run's last step, dimmed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rich.text import Text

from dstui.core.formatting import fmt_bytes, fmt_num
from dstui.core.phases import live_text
from dstui.core.records import bad_lines_note
from dstui.core.terminal import printable
from dstui.tui.home_snapshot import BatchView, RunView
from dstui.usecases.run_figures import eta_text

STATE_STYLE = {
    "queued": "dim",
    "starting": "yellow",
    "running": "bold yellow",
    "done": "green",
    "failed": "bold red",
    "killed": "magenta",
    "skipped": "dim",
}
# "gpus" sits before "reason": the reason stays the last cell (tests and readers look there)
RUN_COLUMNS = ("", "run", "state", "step", "ETA", "loss", "iter s", "tok/s", "peak mem", "gpus", "reason")
BATCH_COLUMNS = ("batch", "runs", "state", "created")


def gpus_text(st: Mapping[str, Any]) -> str:
    """The GPUs the supervisor gave a run (``gpu_slice`` in status.json), '-' for DeepSpeed's default devices."""
    gpu_slice = st.get("gpu_slice")
    return ",".join(str(g) for g in gpu_slice) if gpu_slice else "-"


def run_cells(run: RunView, marked: bool, now: float | None = None) -> tuple:
    """One runs-table row from a run as the snapshot holds it."""
    st = run.status
    last = st.get("last") or {}
    state = st.get("state", "?")
    label = state + (f" {st['verdict']}" if st.get("verdict") else "")
    total = st.get("steps_total") or "?"
    diverged = (st.get("diverged") or {}).get("message")  # the guard's flag: the row turns red
    name = Text(run.name, style="bold red") if diverged else run.name
    speed = run.speed
    figure = "" if speed.mean else "dim"  # a live run's last step, not a mean
    return (
        "✓" if marked else " ",
        name,
        Text(label, style=STATE_STYLE.get(state, "")),
        _progress(st, total, now),
        eta_text(st, run.warmup, now),
        fmt_num(last.get("loss")),
        Text(fmt_num(speed.iter_time, ".3f"), style=figure),
        Text(fmt_num(speed.tokens_per_s, ".0f"), style=figure),
        fmt_bytes(last.get("mem_peak")),
        gpus_text(st),
        reason_cell(st, diverged),
    )


PHASE_WIDTH = 36  # the step column's width for a phase: the other columns stay on an 80-column screen


def _progress(st: Mapping[str, Any], total: object, now: float | None = None) -> str | Text:
    """'4/20', or what a live run does before its first step ('building op shm_comm 12s')."""
    phase = live_text(st, now=now, width=PHASE_WIDTH) if not st.get("steps_done") else ""
    return Text(phase, style="yellow") if phase else f"{st.get('steps_done') or 0}/{total}"


def reason_cell(st: Mapping[str, Any], diverged: str | None) -> Text | str:
    """The reason; the guard's flag in red; else a run's bad metric lines (``N bad lines (first: ...)``)."""
    if diverged:
        return Text(printable(st.get("reason") or diverged, one_line=True)[:60], style="red")
    if st.get("reason"):
        return printable(st["reason"], one_line=True)[:60]
    if st.get("evidence"):  # a PASS with its numbers (dstui.core.verdicts)
        return Text(printable(str(st["evidence"]), one_line=True)[:60], style="green")
    bad = bad_lines_note(st)
    return Text(bad[:60], style="yellow") if bad else ""


def batch_cells(b: BatchView) -> tuple:
    """One batches-table row: id, done/bad counts, finished / live / unsupervised, creation time."""
    info, runs = b.info, b.runs
    states = [r.state for r in runs]
    done = sum(s == "done" for s in states)
    bad = sum(s in ("failed", "killed") for s in states)
    if info.get("finalized") and not b.unfinished:
        where = Text("finished", style="green" if not bad else "red")
    elif b.supervised:
        where = Text("live", style="bold yellow")
    else:
        where = Text("unsupervised", style="magenta")
    created = time.strftime("%m-%d %H:%M", time.localtime(info.get("created", 0)))
    counts = f"{done}/{len(runs)} done" + (f", {bad} bad" if bad else "")
    return (b.id, counts, where, created)
