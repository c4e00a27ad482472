"""Issue 40.5 through the real CLI: a YAML bomb is one line, exit 2, and nothing is made.

Each spec of tests/programs/yaml_bombs.py (a 600-byte billion laughs, 101 aliases, nesting
5,000 levels deep in flow and 1,000 in block style, 8,000 runs of 5 KB of settings): `dstui
run`, `dstui run --dry-run` and `dstui list` each answer with one line naming the limit, exit
2, no traceback, and neither a runs folder nor an MLflow store appears. (How long a refusal
takes is measured by benchmarks/yaml_bombs.py, not asserted here.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers import REPO, dstui

sys.path.insert(0, str(REPO / "tests" / "programs"))
from yaml_bombs import specs  # noqa: E402

WHAT = {
    "billion laughs": "refused: the YAML stands for more than 100,000 values once its aliases are expanded",
    "101 aliases": "refused: the YAML uses more than 100 aliases (*name)",
    "nested 5000 deep (flow)": "refused: the YAML nests deeper than 50 levels",
    "nested 1000 deep (block)": "refused: the YAML nests deeper than 50 levels",
    "8000 runs x 5 KB of settings": "refused: the spec expands to 8000 runs holding 39 MiB of settings",
}


@pytest.mark.parametrize("name", list(WHAT))
def test_a_yaml_bomb_is_one_line_exit_2_and_makes_nothing(name: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    spec = tmp_path / "bomb.yaml"
    spec.write_text(specs()[name])
    env = {"DSTUI_HOME": str(home), "MLFLOW_TRACKING_URI": ""}
    for args in (["run", str(spec)], ["run", "--dry-run", str(spec)], ["list", str(spec)]):
        proc = dstui(*args, env=env, timeout=300)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"dstui: error: {spec}: {WHAT[name]}"), (args, proc.stderr)
        assert "Traceback" not in proc.stdout + proc.stderr
    assert not (home / "runs").exists() and not (home / "mlruns").exists()
