"""Small output helpers shared by the headless commands."""

from __future__ import annotations

from typing import Any

from dstui.core.formatting import eta, fmt_bytes, fmt_num
from dstui.core.rundir import BatchDir, RunDir

__all__ = ["RUN_HEADER", "add_run_refs", "eta", "find_runs", "fmt_bytes", "fmt_num", "run_row", "table"]


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=False)).rstrip()]
    for row in rows:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)).rstrip())
    return "\n".join(lines)


def run_row(rd: RunDir) -> list[str]:
    st = rd.status()
    last = st.get("last") or {}
    progress = f"{st.get('steps_done') or 0}/{st.get('steps_total') or '?'}"
    state = st.get("state", "?")
    if st.get("verdict"):
        state = f"{state} ({st['verdict']})"
    return [
        rd.name,
        state,
        progress,
        eta(st),
        fmt_num(last.get("loss")),
        fmt_num(last.get("iter_time"), ".3f"),
        fmt_num(last.get("tokens_per_s"), ".0f"),
        fmt_bytes(last.get("mem_peak")),
        (st.get("reason") or (st.get("diverged") or {}).get("message") or "")[:70],
    ]


RUN_HEADER = ["run", "state", "step", "eta", "loss", "iter_s", "tok/s", "peak_mem", "reason"]


def runs_table(b: BatchDir) -> str:
    """The batch's runs; Slurm batches get the job id and nodes of each run."""
    runs = b.runs()
    if b.info().get("executor") != "slurm":
        return table([run_row(rd) for rd in runs], RUN_HEADER)
    rows = []
    for rd in runs:
        st = rd.status()
        row = run_row(rd)
        rows.append([*row[:-1], st.get("job_id") or "-", st.get("nodes") or "-", row[-1]])
    return table(rows, [*RUN_HEADER[:-1], "job", "nodes", RUN_HEADER[-1]])


def add_run_refs(p: Any) -> None:
    p.add_argument("runs", nargs="+", help="run name (e.g. z3-r0, newest batch first), batch/run, or run folder")


def find_runs(refs: list[str]) -> list[RunDir]:
    """Every referenced run, or an error naming the first one that does not exist."""
    from dstui.core import paths
    from dstui.core.errors import DstuiError
    from dstui.core.rundir import find_run

    out = []
    for ref in refs:
        rd = find_run(paths.runs_dir(), ref)
        if rd is None:
            raise DstuiError(f"no run '{ref}' under {paths.runs_dir()}")
        out.append(rd)
    return out


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
