"""What is recorded is what ran: ds_config for Ulysses + DeepCompile; `dstui list` for `kind: command`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import dstui

from dstui.spec import dsconfig
from dstui.spec.settings import Settings


@pytest.mark.parametrize(
    ("sp", "sp_mode", "deepcompile", "expected"),
    [
        (2, "deepcompile", False, True),  # the runner adds compile.deepcompile at run time: record it
        (2, "compile", False, False),
        (2, "eager", False, False),
        (1, "deepcompile", False, False),  # sp_mode only matters with sequence parallelism
        (1, "eager", True, True),
    ],
)
def test_ds_config_records_deepcompile_as_the_runner_runs_it(sp: int, sp_mode: str, deepcompile: bool, expected: bool) -> None:
    s = Settings(sequence_parallel=sp, sp_mode=sp_mode, deepcompile=deepcompile, gpus=2, zero_stage=3)
    cfg = dsconfig.from_settings(s)
    # the runner's rule (runners/train.py): args.deepcompile or (sp > 1 and sp_mode == "deepcompile")
    runner_adds = deepcompile or (sp > 1 and sp_mode == "deepcompile")
    assert runner_adds == expected
    assert cfg.get("compile", {}).get("deepcompile", False) is expected
    assert ("ds.compile.deepcompile" in dsconfig.flatten(cfg)) is expected


def test_list_shows_dash_for_what_a_command_run_does_not_say(tmp_path: Path) -> None:
    spec = tmp_path / "cmd.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "cmd", "settings": {"kind": "command", "command": ["python", "-c", "print(1)"], "gpus": 1},
    }))
    # wide enough for every column (a terminal width in the environment, e.g. left by a Textual test, would drop some)
    out = dstui("list", "--no-validate", str(spec), check=True, env={"COLUMNS": "250"}).stdout
    row = next(line.split() for line in out.splitlines() if line.split()[:1] == ["0"])
    header = next(line.split() for line in out.splitlines() if line.startswith("#"))
    cells = dict(zip(header, row, strict=True))
    assert cells["kind"] == "command"
    for col in ("model", "zero", "offload", "compile", "dtype", "mb", "seq", "ga"):
        assert cells[col] == "-", (col, out)
    assert cells["ranks"] == "1"
