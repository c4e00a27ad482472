"""A regular (non-editable) install carries the runners and the shipped configs."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_wheel_ships_runners_and_configs_and_finds_them(tmp_path: Path) -> None:
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(REPO)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = tmp_path.glob("dstui-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for want in ("dstui/bundled/runners/train.py", "dstui/bundled/runners/compare_loss.py",
                 "dstui/bundled/configs/models/tiny-llama.json", "dstui/bundled/configs/experiments/smoke.yaml",
                 "dstui/bundled/configs/deepspeed/base.json", "dstui/tui/dstui.tcss"):  # fmt: skip
        assert want in names, want
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    # The unpacked wheel comes first on the path, so it is what `dstui` resolves to here.
    probe = subprocess.run(
        [sys.executable, "-c",
         "from dstui.core import paths; from dstui.execute import launch; from dstui.spec.loading import expand_file;"
         "print(paths.RUNNERS_DIR); print(paths.CONFIGS_DIR);"
         "print(all(p.is_file() for p in launch.RUNNER_SCRIPTS.values()));"
         "print(len(expand_file(paths.CONFIGS_DIR / 'experiments' / 'smoke.yaml')[1]))"],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(site)}, timeout=120,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-2000:]
    runners, configs, scripts_exist, n_runs = probe.stdout.split()
    assert Path(runners) == site / "dstui" / "bundled" / "runners"
    assert Path(configs) == site / "dstui" / "bundled" / "configs"
    assert scripts_exist == "True" and int(n_runs) >= 1
