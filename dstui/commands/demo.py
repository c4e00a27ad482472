"""`dstui demo`: launch the CPU smoke spec (a small GPU spec when GPUs are present) and watch it.

With a terminal it opens the TUI's live view on the new batch; with
``--no-tui`` (or when stdout is not a terminal) it follows headless like
`dstui run`. Either way the runs are detached: quitting leaves them going.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dstui.core import paths
from dstui.execute import batch, supervisor

SMOKE = paths.CONFIGS_DIR / "experiments" / "smoke.yaml"
SMOKE_GPU = paths.CONFIGS_DIR / "experiments" / "smoke_gpu.yaml"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-tui", action="store_true", help="follow in plain text instead of the TUI")
    p.add_argument("--spec", help="another spec to demo (default: the smoke spec for this machine)")


def demo_spec() -> Path:
    """smoke.yaml on CPU; on GPUs smoke_gpu.yaml, or smoke.yaml sized to the GPUs there are."""
    from dstui.execute import sysmetrics

    n = sysmetrics.gpu_count()
    if n == 0:
        return SMOKE
    from dstui.spec.models import load_spec, save_spec

    spec = load_spec(SMOKE_GPU if SMOKE_GPU.is_file() else SMOKE)
    spec.settings["gpus"] = min(int(spec.settings.get("gpus", 2)), n)  # a 1-GPU box runs 1 rank
    spec.settings["dtype"] = "bf16"
    spec.name = "smoke-gpu"
    out = paths.runs_dir() / "_specs" / "smoke-gpu.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    save_spec(spec, out)
    return out


def run(args: argparse.Namespace) -> int:
    spec = Path(args.spec) if args.spec else demo_spec()
    headless = args.no_tui or not sys.stdout.isatty()
    print(f"dstui demo: {spec}", flush=True)
    plan = batch.plan(spec)
    b = batch.create(plan)
    supervisor.spawn(b)
    print(f"batch {b.id}: {len(plan.runs)} runs in {b.path}", flush=True)
    if headless:
        from dstui.commands.run import follow

        return follow(b)
    from dstui.tui.app import DstuiApp

    app = DstuiApp(spec_path=spec, batch_id=b.id, live=True)
    app.run()
    print(f"the runs go on; `dstui status {b.id}` or `dstui` to look again")
    return 0
