"""`dstui demo`: launch the CPU smoke spec (a small GPU spec when GPUs are present) and watch it.

With a terminal it opens the TUI's live view on the new batch; with
``--no-tui`` (or when stdout is not a terminal) it follows headless like
`dstui run`. Either way the runs are detached: quitting leaves them going.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dstui.core.rundir import FINAL_STATES, BatchDir
from dstui.usecases import launch
from dstui.usecases.options import LaunchOptions


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-tui", action="store_true", help="follow in plain text instead of the TUI")
    p.add_argument("--spec", help="another spec to demo (default: the smoke spec for this machine)")


def run(args: argparse.Namespace) -> int:
    spec = Path(args.spec) if args.spec else launch.demo_spec()
    headless = args.no_tui or not sys.stdout.isatty()
    print(f"dstui demo: {spec}", flush=True)
    options = LaunchOptions()  # `dstui run SPEC`'s defaults: the same checks, skips and supervisor
    started = launch.start(launch.prepare(spec, options), options)
    b = started.batch
    print(f"batch {b.id}: {started.runs} runs in {b.path}", flush=True)
    if headless:
        from dstui.commands._follow_out import follow

        return follow(b)
    from dstui.tui.app import DstuiApp

    app = DstuiApp(spec_path=spec, batch_id=b.id, live=True)
    app.run()
    print(ending(b))
    return 0


def ending(b: BatchDir) -> str:
    """What the demo says as the TUI closes: the runs go on only while some have not ended (issue 38.6)."""
    runs = b.runs()
    going = [rd for rd in runs if rd.state not in FINAL_STATES]
    if going:
        return f"{len(going)} of {len(runs)} runs go on; `dstui status {b.id}` or `dstui` to look again"
    done = sum(rd.state == "done" for rd in runs)
    return f"every run has ended ({done}/{len(runs)} done); `dstui report -b {b.id}` writes the report, `dstui` shows them"
