"""`dstui` / `dstui tui [SPEC]`: the terminal UI (compose, launch, watch, compare)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dstui.commands import _argtypes
from dstui.core.errors import DstuiError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", nargs="?", help="experiment spec to open in Compose (and launch with l)")
    p.add_argument("--batch", help="batch id to show first")
    p.add_argument("--live", action="store_true", help="open the live view on that batch")
    p.add_argument(
        "--parallel",
        type=_argtypes.count(0, " (0 = auto)"),
        default=0,
        metavar="N",
        help="runs at a time for batches launched here, as `dstui run --parallel` (default 0 = auto: "
        "as many as fit on disjoint GPUs of this box, one at a time without GPUs; 1 = one after another)",
    )


def run(args: argparse.Namespace) -> int:
    spec = getattr(args, "spec", None)
    if spec and Path(spec).expanduser().is_dir():
        # nothing sensible to open or to start a new spec in: said before the screen takes the terminal
        raise DstuiError(f"{spec}: a folder, not a spec file (give a .yaml path)")
    # textual is imported only here, so headless commands never pay for it
    from dstui.tui.app import DstuiApp

    app = DstuiApp(
        spec_path=Path(spec).expanduser() if spec else None,
        batch_id=getattr(args, "batch", None),
        live=getattr(args, "live", False),
        parallel=getattr(args, "parallel", 0) or 0,  # never below 0: _argtypes.count
    )
    app.run()
    return int(app.return_code or 0)
