"""The sp-check's derived tolerance (runners/sp_check.py), from known losses; no DeepSpeed launch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runners"))

import sp_check  # noqa: E402


def test_bf16_compile_run_of_the_gpu_report_passes() -> None:
    """Issue 11's numbers: |d loss| 6.6e-4 and 5.6e-4 at a loss near 5, bf16, compile."""
    ref = [5.10, 4.90]
    sp = [5.10 + 6.6e-4, 4.90 - 5.6e-4]
    noise = [5.10 + 5.0e-4, 4.90 + 1.0e-4]  # eager vs compile without SP, same order of size
    tols, how = sp_check.tolerances(ref, noise, "bf16")
    assert tols[0] == pytest.approx(max(4 * 5.0e-4, 2.0**-9 * 5.10))
    ok, margin, lines = sp_check.compare(sp, ref, tols)
    assert ok and margin == pytest.approx(tols[0] / 6.6e-4)
    assert "measured noise 5.00e-04" in how and "bf16" in how
    assert all(line.endswith("ok") for line in lines)


def test_the_old_fixed_tolerance_would_have_failed_it() -> None:
    ref, sp = [5.10], [5.10 + 6.6e-4]
    ok, _, _ = sp_check.compare(sp, ref, [max(1e-5, 1e-4 * 5.10)])
    assert not ok


def test_fp32_difference_far_above_noise_fails() -> None:
    ref = [6.2383, 6.2101]
    sp = [6.2383 + 3e-4, 6.2101 + 8e-4]  # a broken head split moves losses by this much and more
    tols, _ = sp_check.tolerances(ref, list(ref), "fp32")  # a deterministic repeat: no noise
    assert tols == [pytest.approx(1e-5 * r) for r in ref]
    ok, margin, lines = sp_check.compare(sp, ref, tols)
    assert not ok and margin < 1 and lines[1].endswith("DIFF")


def test_missing_steps_fail() -> None:
    ok, _, _ = sp_check.compare([1.0], [1.0, 1.0], [1e-3, 1e-3])
    assert not ok


def test_deepcompile_with_sequence_parallelism_is_refused_before_launch() -> None:
    from dstui.core.errors import SpecError
    from dstui.spec.models import expand, parse_spec

    spec = {"name": "u", "settings": {"gpus": 2, "sequence_parallel": 2, "sp_check": True},
            "axes": {"sp_mode": ["eager", "deepcompile"]}}  # fmt: skip
    with pytest.raises(SpecError) as err:
        expand(parse_spec(spec))
    text = str(err.value)
    assert "_get_data_parallel_group() returns None" in text and "0.19.8" in text
    assert "sp_mode" in text and "deepcompile" in text  # names the field and the condition
    spec["axes"] = {"sp_mode": ["eager", "compile"]}
    assert len(expand(parse_spec(spec))) == 2
