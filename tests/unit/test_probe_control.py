"""The runner's side of a probe: the stop request's file, and the test-only hang's matching rule."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runners"))

import probe_control  # noqa: E402

from dstui.core.rundir import RunDir  # noqa: E402


def test_the_stop_request_is_the_run_folders_file_and_only_rank_0_looks(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    rank0 = probe_control.StopRequest(str(rd.metrics_file))
    others = probe_control.StopRequest(None)
    assert not rank0.asked() and not others.asked()
    rd.stop_file.write_text("ranked")
    assert rank0.asked() and not others.asked()


@pytest.mark.parametrize(("value", "config", "step"), [
    ("", {"zero_stage": 1}, None),
    ("zero_stage=1,micro_batch=4", {"zero_stage": 1, "micro_batch": 4}, 1),
    ("zero_stage=1,micro_batch=4,step=3", {"zero_stage": 1, "micro_batch": 4}, 3),
    ("zero_stage=1,micro_batch=4", {"zero_stage": 1, "micro_batch": 2}, None),
    ("deepcompile=false", {"deepcompile": False}, 1),
])  # fmt: skip
def test_the_injected_hang_matches_the_runners_arguments(monkeypatch: pytest.MonkeyPatch, value: str,
                                                         config: dict, step: int | None) -> None:  # fmt: skip
    monkeypatch.setenv(probe_control.HANG_ENV, value)
    assert probe_control.injected_hang_step(config) == step
