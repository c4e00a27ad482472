"""A rank does not import mlflow through DeepSpeed's autotuner (~1.9 s of each rank's start), unless asked to."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import REPO

PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import common
marked = common.skip_unused_imports()
import deepspeed
from deepspeed.autotuning import autotuner
print(json.dumps({"marked": marked, "mlflow_loaded": sys.modules.get("mlflow") is not None,
                  "deepspeed_sees_mlflow": autotuner.has_mlflow}))
"""


@pytest.mark.e2e
@pytest.mark.parametrize("setting, mlflow_in_rank", [(None, False), ("all", True)])
def test_ranks_skip_mlflow_unless_told(setting: str | None, mlflow_in_rank: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DSTUI_RANK_IMPORTS"}
    if setting:
        env["DSTUI_RANK_IMPORTS"] = setting
    out = subprocess.run([sys.executable, "-c", PROBE, str(REPO / "runners")], env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["mlflow_loaded"] is mlflow_in_rank and got["deepspeed_sees_mlflow"] is mlflow_in_rank
    assert got["marked"] == ([] if mlflow_in_rank else ["mlflow"])
