"""An opt-in trace of `dstui run`'s own start-up: where the time before a rank's launch goes.

``DSTUI_TRACE=FILE`` in the environment: the CLI, the supervisor it starts and
the run wrapper append one JSON line per mark to FILE::

    {"mark": "plan_done", "t": 1795607297.24, "pid": 4711, "who": "cli"}

``t`` is unix time (the rank's ``phases`` record and the benchmark harness use
it too, so marks of different processes line up). A process's first mark is
preceded by its ``process_start`` (from /proc: the interpreter's start and the
imports before the first mark are counted). Unset (the default): nothing is
written and a mark costs one environment look-up. A line is one ``O_APPEND``
write, so processes writing at once do not interleave; a mark that cannot be
written is dropped (never a reason to stop a launch).

benchmarks/gpu/bare_vs_dstui.py sets it per launch and prints the segments
between the marks. Stdlib only: the run wrapper imports it.
"""

from __future__ import annotations

import json
import os
import time

ENV = "DSTUI_TRACE"

_started: set[int] = set()  # pids whose process_start was written (a fork is another process)


def process_start_time() -> float:
    """When the kernel started this process (unix time): /proc/self/stat's start tick against /proc/uptime."""
    try:
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        return time.time() - max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


def enabled() -> bool:
    return bool(os.environ.get(ENV))


def mark(name: str, who: str) -> None:
    """Append ``name`` at the current time (after this process's start, the first time)."""
    path = os.environ.get(ENV)
    if not path:
        return
    pid = os.getpid()
    lines = []
    if pid not in _started:
        _started.add(pid)
        lines.append({"mark": "process_start", "t": process_start_time(), "pid": pid, "who": who})
    lines.append({"mark": name, "t": time.time(), "pid": pid, "who": who})
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except OSError:
        pass


def read(path: str | os.PathLike[str]) -> list[dict]:
    """The marks of a trace file in time order; lines that are not marks are skipped."""
    out = []
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if (
                    isinstance(rec, dict)
                    and isinstance(rec.get("mark"), str)
                    and isinstance(rec.get("t"), (int, float))
                ):
                    out.append(rec)
    except OSError:
        return []
    return sorted(out, key=lambda r: r["t"])
