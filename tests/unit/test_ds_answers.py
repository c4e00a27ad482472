"""DeepSpeed's answers (config accepted, ZeRO memory estimates) are remembered per install, refusals never."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import IMPORTS_DEEPSPEED

from dstui.core import ds_answers
from dstui.core.errors import SpecError
from dstui.spec import dsconfig

pytestmark = IMPORTS_DEEPSPEED

GOOD = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 2}}

# a fresh process: whether answering needed DeepSpeed shows in sys.modules
PROBE = """
import json, sys
from dstui.spec import dsconfig
from dstui.analysis import forecast_model as fm
dsconfig.validate(json.loads(sys.argv[1]), world_size=2)
shape = fm.ModelShape(family="llama", vocab=256, hidden=64, intermediate=128, layers=2, heads=4, kv_heads=4,
                      positions=128, tied=False)
states = [fm.model_states(shape, zero_stage=z, offload="none", offload_params="none", dtype="bf16", gpus=2, nodes=1)
          for z in (1, 3)]
print(json.dumps({"deepspeed_imported": "deepspeed" in sys.modules, "states": states}))
"""


def probe(cache: Path, cfg: dict) -> dict:
    env = {"DSTUI_CACHE": str(cache), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(cfg)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.e2e
def test_second_process_answers_without_importing_deepspeed(tmp_path: Path) -> None:
    first = probe(tmp_path / "cache", GOOD)
    second = probe(tmp_path / "cache", GOOD)
    assert first["deepspeed_imported"] and not second["deepspeed_imported"]
    assert second["states"] == first["states"] and first["states"][0] > first["states"][1] > 0
    # another config is another question: DeepSpeed is asked again
    other = probe(tmp_path / "cache", {**GOOD, "gradient_accumulation_steps": 2})
    assert other["deepspeed_imported"]


def test_refusal_is_never_remembered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSTUI_CACHE", str(tmp_path))
    bad = {**GOOD, "zero_optimization": {"stage": 2, "no_such_option": 1}}
    for _ in range(2):  # the second time is DeepSpeed's word again, not a cached pass
        with pytest.raises(SpecError, match="no_such_option"):
            dsconfig.validate(bad, world_size=2)
    assert not list((tmp_path / ds_answers.FOLDER).glob("config-accepted/*"))
    dsconfig.validate(GOOD, world_size=2)
    assert len(list((tmp_path / ds_answers.FOLDER).glob("config-accepted/*"))) == 1


def test_the_key_names_the_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An upgraded or edited DeepSpeed (another install id) is asked again; a damaged cache file is asked again."""
    monkeypatch.setenv("DSTUI_CACHE", str(tmp_path))
    asked: list[int] = []

    def ask() -> int:
        asked.append(1)
        return 42

    assert ds_answers.remembered("test", [1], ask) == 42
    assert ds_answers.remembered("test", [1], ask) == 42 and len(asked) == 1
    monkeypatch.setattr(ds_answers, "install_id", lambda: "0.0.0|/elsewhere|1")
    assert ds_answers.remembered("test", [1], ask) == 42 and len(asked) == 2
    for f in (tmp_path / ds_answers.FOLDER / "test").iterdir():
        f.write_text("{half")
    assert ds_answers.remembered("test", [1], ask) == 42 and len(asked) == 3
    monkeypatch.setattr(ds_answers, "install_id", lambda: None)  # DeepSpeed not found: always asked, nothing kept
    assert ds_answers.remembered("test", [1], ask) == 42 and len(asked) == 4
