"""dstui's rank starter gives every rank the environment and argv DeepSpeed's launcher gives it.

Both start tests/programs/dump_rank_env.py (it only writes its argv and
environment), DeepSpeed's launcher through `python -m deepspeed.launcher.runner
--num_gpus 2` (it imports DeepSpeed twice), dstui's through `python -m
dstui.execute.injob.ranks --nproc 2`. Variables that differ by construction are
left out: the dump folder, and telemetry ids mlflow sets when DeepSpeed imports it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dstui.execute.launch import free_port

DUMP = Path(__file__).resolve().parent.parent / "programs" / "dump_rank_env.py"
DIFFER_BY_CONSTRUCTION = {"DUMP_DIR"}


def _dump(cmd: list[str], folder: Path) -> dict[int, dict]:
    folder.mkdir()
    env = {**os.environ, "DUMP_DIR": str(folder), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=folder)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return {r: json.loads((folder / f"rank{r}.json").read_text()) for r in (0, 1)}


def _comparable(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in DIFFER_BY_CONSTRUCTION and not k.startswith("_MLFLOW")}


def test_same_rank_environment_as_deepspeeds_launcher(tmp_path: Path) -> None:
    port = str(free_port())  # one port for both (it is in the environment); not a fixed one: tests run side by side
    deepspeed = _dump(
        [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port", port,
         str(DUMP), "--x", "1"], tmp_path / "ds")  # fmt: skip
    dstui = _dump(
        [sys.executable, "-m", "dstui.execute.injob.ranks", "--nproc", "2", "--master-port", port, "--",
         sys.executable, str(DUMP), "--x", "1"], tmp_path / "dstui")  # fmt: skip
    for rank in (0, 1):
        assert dstui[rank]["argv"] == deepspeed[rank]["argv"] == [f"--local_rank={rank}", "--x", "1"]
        assert _comparable(dstui[rank]["env"]) == _comparable(deepspeed[rank]["env"])
        assert dstui[rank]["env"]["RANK"] == str(rank)
