"""Issue 38.6's smaller items in the CLI: an lr axis in `dstui list`, `--dry-run` builds no env,
`dstui ui` names its links without MLflow's client, the demo's last line says what is true.

(The TUI's: tests/tui/test_tui_keys.py; `ui --start`'s link: tests/e2e/test_ui_start.py;
the timings: benchmarks/cli_latency.py.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dstui import cli
from dstui.commands import demo
from dstui.core.paths import REPO_DIR
from dstui.core.rundir import BatchDir, RunDir, merge_status, write_json_atomic

LRSWEEP = str(REPO_DIR / "configs" / "experiments" / "lrsweep.yaml")


@pytest.mark.no_store
def test_list_shows_an_lr_axis_in_its_own_column_and_in_json(home: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["list", LRSWEEP, "--no-validate", "--no-history"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert header[:3] == ["#", "run", "lr"], lines[0]
    rows = {line.split()[1]: line.split()[2] for line in lines[1:5]}
    assert rows == {"z1-lr0.0001-r0": "0.0001", "z1-lr0.001-r0": "0.001", "z2-lr0.0001-r0": "0.0001", "z2-lr0.001-r0": "0.001"}
    assert cli.main(["list", LRSWEEP, "--no-validate", "--no-history", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["settings"]["lr"] for r in doc["runs"]] == [1e-4, 1e-3, 1e-4, 1e-3]
    assert [r["settings"]["zero_stage"] for r in doc["runs"]] == [1, 1, 2, 2]


def test_varying_settings_leave_out_what_has_a_column_and_what_may_hold_secrets() -> None:
    from dstui.spec.expand import expand
    from dstui.spec.loading import parse_spec
    from dstui.usecases import varying_settings

    spec = parse_spec({
        "name": "v", "settings": {"model": "tiny-llama", "steps": 4},
        "conditions": [{"name": "a", "lr": 1e-4, "seed": 1, "env": {"TOKEN": "x"}, "zero_stage": 1},
                       {"name": "b", "lr": 3e-4, "seed": 2, "env": {"TOKEN": "y"}, "zero_stage": 2}],
    }, file="v.yaml")  # fmt: skip
    runs = expand(spec, file="v.yaml")
    assert varying_settings.varying(runs) == ["lr", "seed"]  # not zero_stage (a column), not env
    assert varying_settings.value_text(3e-4) == "0.0003" and varying_settings.value_text({"a": [1, 2]}) == '{"a":[1,2]}'
    assert varying_settings.value_text("x" * 40) == "x" * 23 + "…"


@pytest.mark.no_store
def test_dry_run_of_a_revisions_spec_builds_no_env(home: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """`run --dry-run` of a spec with a PyPI revision pip-built its env (57 s): it only looks it up now."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("DSTUI_CACHE", str(cache))
    spec = tmp_path / "revs.yaml"
    spec.write_text("name: revs\nsettings: {model: tiny-llama, steps: 4, gpus: 2}\n"
                    "revisions:\n  - {name: stable, pypi: '0.18.0'}\n  - {name: here, installed: true}\n")  # fmt: skip
    assert cli.main(["run", "--dry-run", "--no-validate", str(spec)]) == 0
    out = capsys.readouterr().out
    assert not (cache / "envs").exists() or not any((cache / "envs").iterdir())  # nothing built
    env_python = next(line for line in out.splitlines() if line.startswith("# revision stable"))
    assert "not built yet: the launch builds it (pip:" in env_python and "/envs/pypi-0.18.0-" in env_python
    assert "--dry-run" in out and "nothing launched" in out
    stable_cmd = next(line for line in out.splitlines() if "base-stable-r0/ds_config.json" in line)
    assert "/envs/pypi-0.18.0-" in stable_cmd  # the interpreter the launch will use, shown


def test_ui_names_its_links_without_mlflows_client(home: Path) -> None:
    """`dstui ui` took 12.8 s to print: MLflow's client was imported to find a run's experiment."""
    from helpers import batch_in_store

    exp, run_id = batch_in_store(home, "links-20260101-000000")
    probe = ("import sys; from dstui import cli; cli.main(['ui', '--port', '5123']); "
             "print('MLFLOW IMPORTED' if 'mlflow' in sys.modules else 'NO MLFLOW')")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=home).stdout
    assert f"http://127.0.0.1:5123/#/experiments/{exp}/runs?viewStateShareKey=" in out
    assert f"experiments=%5B%22{exp}%22%5D" in out and run_id in out
    assert out.strip().endswith("NO MLFLOW")


def test_the_demo_says_the_runs_go_on_only_while_they_do(tmp_path: Path) -> None:
    b = BatchDir(tmp_path / "demo-20260101-000000")
    for name, state in (("z0-r0", "done"), ("z1-r0", "running")):
        merge_status(RunDir(b.path / name), dict(name=name, state=state))
    write_json_atomic(b.batch_file, {"id": b.id, "runs": ["z0-r0", "z1-r0"]})
    assert demo.ending(b).startswith("1 of 2 runs go on;")
    merge_status(RunDir(b.path / "z1-r0"), dict(state="failed"))
    said = demo.ending(b)
    assert "go on" not in said and said.startswith("every run has ended (1/2 done)")
