"""The live divergence/NaN guard's logic, fed step records as the supervisor does."""

from __future__ import annotations

import math

import pytest

from dstui.core.rundir import merge_status
from dstui.execute.guard import DivergenceGuard, Flag, GuardConfig, losses_from_records

BASE = {1: 6.0, 2: 5.5, 3: 5.0, 4: 4.6, 5: 4.3}


def test_flags_the_first_step_outside_the_tolerance() -> None:
    g = DivergenceGuard(GuardConfig(baseline="z0", rtol=0.01))
    for step, loss in [(1, 6.0), (2, 5.54), (3, 5.2), (4, 4.0)]:  # 5.54 is within 1% of 5.5; 5.2 is not
        g.observe(step, loss)
    flag = g.check(BASE)
    assert flag == Flag(3, "divergence", 5.2, 5.0)
    assert flag.message == "diverged at step 3 (Δ=+0.2)"
    assert g.check(BASE) is None  # only the first flag counts
    assert not g.should_stop  # stop_on not set


def test_allclose_rule_is_the_verify_rule() -> None:
    cfg = GuardConfig(baseline="b", rtol=0.1, atol=0.5)
    assert cfg.close(10.0 + 1.5, 10.0)  # 1.5 <= 0.5 + 0.1 * 10
    assert not cfg.close(10.0 + 1.51, 10.0)
    exact = GuardConfig(baseline="b", rtol=0.0, atol=0.0)
    assert exact.close(2.0, 2.0) and not exact.close(2.0, math.nextafter(2.0, 3.0))


def test_waits_for_a_lagging_baseline_so_the_flag_is_never_late() -> None:
    g = DivergenceGuard(GuardConfig(baseline="z0", atol=0.01, stop_on=("divergence",)))
    for step in (1, 2, 3, 4):
        g.observe(step, BASE[step] + (1.0 if step >= 2 else 0.0))
    assert g.check({1: 6.0}) is None  # the baseline is at step 1: step 2 waits
    flag = g.check({1: 6.0, 2: 5.5})
    assert flag is not None and flag.step == 2 and g.should_stop


def test_baseline_that_ended_short_leaves_later_steps_unchecked() -> None:
    g = DivergenceGuard(GuardConfig(baseline="z0", atol=0.0))
    g.observe(1, 6.0)
    g.observe(2, 99.0)
    assert g.check({1: 6.0}, baseline_ended=True) is None
    assert not g.pending


def test_nan_and_inf_are_flagged_without_a_baseline() -> None:
    g = DivergenceGuard(GuardConfig(stop_on=("nan",)))
    g.observe(1, 6.0)
    g.observe(2, float("nan"))
    flag = g.check()
    assert flag.kind == "nan" and flag.step == 2 and g.should_stop
    assert flag.message == "diverged at step 2 (loss=nan)"
    g2 = DivergenceGuard(GuardConfig())
    g2.observe(5, float("inf"))
    assert g2.check().message == "diverged at step 5 (loss=inf)"
    assert g2.flag.as_dict()["loss"] == "inf"  # JSON has no inf


def test_nan_waits_behind_an_undecided_earlier_step() -> None:
    """Step 2 departs, step 3 is NaN, the baseline is late: the flag is step 2's divergence."""
    g = DivergenceGuard(GuardConfig(baseline="z0", atol=0.01))
    g.observe(1, 6.0)
    g.observe(2, 7.0)
    g.observe(3, float("nan"))
    assert g.check({1: 6.0}) is None
    assert g.check(BASE).kind == "divergence"


def test_the_baseline_run_itself_only_gets_the_nan_check() -> None:
    g = DivergenceGuard(GuardConfig(baseline="z0", atol=0.0), is_baseline=True)
    g.observe(1, 123.0)
    assert g.check({}) is None
    g.observe(2, float("nan"))
    assert g.check({}).kind == "nan"


def test_no_tolerance_means_no_divergence_check() -> None:
    cfg = GuardConfig(baseline="z0")
    assert not cfg.checks_divergence
    g = DivergenceGuard(cfg)
    g.observe(1, 100.0)
    assert g.check(BASE) is None


def test_losses_from_records() -> None:
    recs = [{"type": "header"}, {"type": "step", "step": 1, "loss": 2.0}, {"type": "step", "step": 2},
            {"type": "summary", "final_loss": 1.0}]  # fmt: skip
    assert losses_from_records(recs) == {1: 2.0}


@pytest.mark.parametrize(
    ("guard", "message"),
    [
        ("{baseline: nope, atol: 0.1}", "field 'guard.baseline': 'nope' is not a condition of this spec (conditions: a, b)"),
        ("{rtol: 0.1}", "field 'guard': a loss tolerance needs a baseline condition"),
        ("{stop_on: [oom]}", "field 'guard.stop_on.0'"),
    ],
)
def test_bad_guard_settings_are_one_line_errors(tmp_path, guard: str, message: str) -> None:  # noqa: ANN001
    """Found while planning (before any folder exists): `dstui run`/`list` exit 2 with this line."""
    from dstui.core.errors import SpecError
    from dstui.execute import batch

    spec = tmp_path / "g.yaml"
    spec.write_text(f"name: g\nconditions: [{{name: a}}, {{name: b}}]\nguard: {guard}\n")
    with pytest.raises(SpecError) as err:
        batch.plan(spec, validate=False, resolve_revisions=False)
    assert message in str(err.value) and str(spec) in str(err.value)
    assert "\n" not in str(err.value)


def _run_folder(batch, name: str, condition: str, kind: str, losses: list[float], state: str) -> None:  # noqa: ANN001
    import json

    from dstui.core.rundir import RunDir, write_json_atomic

    rd = RunDir(batch / name)
    write_json_atomic(rd.spec_file, {"condition": condition, "revision": "installed", "repeat": 0,
                                     "settings": {"kind": kind}})  # fmt: skip
    rd.metrics_file.write_text("".join(json.dumps({"type": "step", "step": i + 1, "loss": x}) + "\n"
                                       for i, x in enumerate(losses)))  # fmt: skip
    merge_status(rd, dict(name=name, state=state))


def test_batch_guard_reads_the_baseline_from_disk_and_survives_a_takeover(tmp_path) -> None:  # noqa: ANN001
    from dstui.core.rundir import BatchDir, RunDir, write_json_atomic
    from dstui.execute.guard_watch import BatchGuard

    path = tmp_path / "b"
    write_json_atomic(path / "batch.json", {"runs": ["base-r0", "lr-r0", "vfy-r0"],
                                            "spec": {"baseline": "base", "guard": {"atol": 0.01}}})  # fmt: skip
    _run_folder(path, "base-r0", "base", "train", [6.0, 5.5], "running")  # baseline at step 2 of 3
    _run_folder(path, "lr-r0", "lr", "train", [6.0, 5.5, 4.0], "running")
    _run_folder(path, "vfy-r0", "vfy", "verify", [9.0, 9.0], "done")
    b = BatchDir(path)

    def feed(guards: BatchGuard, name: str):  # noqa: ANN202
        return guards.check(RunDir(path / name))

    guards = BatchGuard(b)
    assert feed(guards, "lr-r0") is None  # step 3 waits for the baseline's step 3
    assert feed(guards, "vfy-r0") is None  # another kind: no comparison with a train curve
    with open(path / "base-r0" / "metrics.jsonl", "a") as fh:
        fh.write('{"type": "step", "step": 3, "loss": 5.2}\n')
    flag = guards.check(RunDir(path / "lr-r0"))
    assert flag is not None and flag.step == 3 and flag.baseline == 5.2
    RunDir(path / "lr-r0").update_status(diverged=flag.as_dict())  # as the supervisor does
    # a new supervisor re-reads the curves, and never flags the run twice
    again = BatchGuard(b)
    assert feed(again, "lr-r0") is None and again.guard(RunDir(path / "lr-r0")).flag == flag
