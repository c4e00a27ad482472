"""The sp-check's derived loss tolerance (runners/sp_check.py) and the spec's sequence-parallel rules; no launch."""

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


def _expand(settings: dict, axes: dict | None = None) -> list:
    from dstui.spec.expand import expand
    from dstui.spec.loading import parse_spec

    spec = {"name": "u", "settings": {"gpus": 2, "sequence_parallel": 2, "sp_check": True, **settings}}
    if axes:
        spec["axes"] = axes
    return expand(parse_spec(spec))


def test_every_sp_mode_expands_deepcompile_included() -> None:
    """DeepCompile + Ulysses is no longer refused in specs (the runner passes the group DeepSpeed left None)."""
    runs = _expand({}, {"sp_mode": ["eager", "compile", "deepcompile", "ring"]})
    assert [r.settings.sp_mode for r in runs] == ["eager", "compile", "deepcompile", "ring"]
    assert _expand({"deepcompile": True})[0].settings.deepcompile


@pytest.mark.parametrize(
    ("settings", "field", "words"),
    [
        ({"sp_mode": "ring", "compile": True}, "compile", "sp_mode ring runs eager"),
        ({"sp_mode": "ring", "deepcompile": True}, "deepcompile", "drop deepcompile: true"),
        ({"sp_mode": "ring", "seq_length": 130}, "seq_length", "seq_length 130 is not a multiple of 4"),
    ],
)
def test_what_ring_attention_cannot_run_is_refused_with_the_field(settings: dict, field: str, words: str) -> None:
    from dstui.core.errors import SpecError

    with pytest.raises(SpecError) as err:
        _expand(settings)
    assert words in str(err.value) and err.value.field == field
    # the same settings without sequence parallelism are nobody's business here
    assert _expand({**settings, "sequence_parallel": 1})


def test_deepcompile_is_refused_on_a_cpu_box_for_the_cpu_reason_only() -> None:
    from dstui.execute import feasibility
    from dstui.execute.feasibility import Machine

    sp_dc = {"kind": "train", "sequence_parallel": 2, "sp_mode": "deepcompile", "gpus": 2}
    field, value, why = feasibility.run_problem(sp_dc, Machine(gpus=0, cpu_cores=2))
    assert (field, value) == ("sp_mode", "deepcompile") and "needs a CUDA GPU; this machine has none" in why
    assert feasibility.run_problem(sp_dc, Machine(gpus=2, gpu_memory=80 * 1024**3, bf16=True, cpu_cores=16)) is None
