"""Session leader of a run: starts the job, waits, records how it ended.

The supervisor may die or be restarted while a run goes on; the exit status of
a process is only known to its parent, so this tiny wrapper (stdlib only, fast
to start) is that parent and writes ``exit.json`` into the run folder.
Usage: python -m dstui.execute.wrap RUN_DIR -- ARGV...
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from dstui.core.rundir import EXIT_FILE

USAGE = "usage: python -m dstui.execute.wrap RUN_DIR -- ARGV..."


def parse_argv(argv: list[str]) -> tuple[str, list[str]]:
    """RUN_DIR and the job's argv; ValueError (with the usage) for anything else."""
    if len(argv) < 3 or argv[1] != "--" or not argv[0]:
        raise ValueError(f"bad arguments {argv!r}; {USAGE}")
    if not os.path.isdir(argv[0]):
        raise ValueError(f"run folder {argv[0]!r} does not exist; {USAGE}")
    return argv[0], argv[2:]


def main(argv: list[str]) -> int:
    try:
        run_dir, cmd = parse_argv(argv)
    except ValueError as e:
        print(f"dstui.execute.wrap: {e}", file=sys.stderr, flush=True)
        return 2
    try:
        child = subprocess.Popen(cmd)
    except OSError as e:
        print(f"dstui: cannot start {cmd[0]!r}: {e}", flush=True)
        _write(run_dir, {"exit_code": 127, "signal": None, "error": str(e)})
        return 127

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, forward)
    code = child.wait()
    sig = -code if code < 0 else None
    _write(run_dir, {"exit_code": code, "signal": sig, "ended": time.time()})
    return code if code >= 0 else 128 + (sig or 0)


def _write(run_dir: str, data: dict) -> None:
    path = os.path.join(run_dir, EXIT_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
