"""The core imports without textual; the TUI's start path imports no mlflow/torch/deepspeed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from tui_helpers import seed_spec

HEAVY = ("torch", "deepspeed", "mlflow", "pandas", "matplotlib", "transformers")


def modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_core_imports_without_textual():
    mods = modules_after("import dstui.spec.expand, dstui.spec.loading, dstui.execute.batch, dstui.execute.supervisor, dstui.core.rundir, dstui.tracking.client, dstui.cli")
    assert not {m for m in mods if m.split(".")[0] in ("textual", "textual_plotext", "plotext")}


def test_tui_start_path_is_light():
    mods = modules_after(
        "import dstui.tui.app, dstui.commands.tui\n"
        "from dstui.tui.app import DstuiApp\n"
        "DstuiApp()"
    )
    assert "textual" in mods
    assert not {m for m in mods if m.split(".")[0] in HEAVY}


@pytest.mark.e2e  # starts supervisors / the CLI in subprocesses
def test_demo_headless_follows_like_run(tui_env):  # noqa: F811
    spec = seed_spec(tui_env, name="demo-seed")
    out = subprocess.run(
        [sys.executable, "-m", "dstui", "demo", "--spec", str(spec)],  # stdout is a pipe: headless
        capture_output=True, text=True, env=os.environ.copy(), timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1/1 runs done" in out.stdout
    assert yaml.safe_load(spec.read_text())["name"] == "demo-seed"
