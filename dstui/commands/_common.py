"""Small output helpers shared by the headless commands."""

from __future__ import annotations

import time
from typing import Any

from dstui.core.rundir import BatchDir, RunDir


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=False)).rstrip()]
    for row in rows:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)).rstrip())
    return "\n".join(lines)


def fmt_bytes(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return "-"


def fmt_num(x: Any, spec: str = ".4g") -> str:
    return format(x, spec) if isinstance(x, (int, float)) else "-"


def eta(st: dict[str, Any]) -> str:
    done, total, started = st.get("steps_done") or 0, st.get("steps_total") or 0, st.get("started")
    if st.get("state") != "running" or not started or not done or not total:
        return "-"
    left = (time.time() - started) / done * (total - done)
    return f"{left:.0f}s" if left < 120 else f"{left / 60:.0f}m"


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
