"""The live divergence/NaN guard's logic, fed step records as the supervisor does."""

from __future__ import annotations

import math
import time

import pytest
from test_tui_helpers import anyio_backend, fixture_batch, tui_env, wait_for  # noqa: F401

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


# -- in the product: TUI (fixture), then the whole flow on real DeepSpeed runs ------------------

def _legend_text(screen) -> str:  # noqa: ANN001
    from textual.widgets import Static

    return str(screen.query_one("#legend", Static).render())


@pytest.mark.anyio
async def test_tui_rows_and_legend_turn_red_for_a_flagged_run(tui_env) -> None:  # noqa: F811
    from rich.text import Text

    from dstui.core.rundir import RunDir
    from dstui.tui.app import DstuiApp
    from dstui.tui.screens.live import LiveScreen

    b = fixture_batch(tui_env)
    flag = Flag(7, "divergence", 5.0, 4.5)
    RunDir(b.path / "z1-r0").update_status(diverged=flag.as_dict())
    app = DstuiApp(batch_id=b.id, supervise=False, watch_s=0.3)
    async with app.run_test(size=(160, 40)) as pilot:
        screen = app.screen
        assert await wait_for(pilot, lambda: "z1-r0" in screen._rows, timeout=20)
        row = screen._rows["z1-r0"]
        assert isinstance(row[1], Text) and row[1].style == "bold red"
        assert str(row[-1]) == "diverged at step 7 (Δ=+0.5)"
        assert not isinstance(screen._rows["z0-r0"][1], Text)  # unflagged rows keep their colour
        await pilot.press("v")
        assert await wait_for(pilot, lambda: isinstance(app.screen, LiveScreen), timeout=10)
        assert await wait_for(pilot, lambda: "diverged at step 7 (Δ=+0.5)" in _legend_text(app.screen), timeout=20)


GUARD_SPEC = """
name: guard-e2e
settings:
  {model: tiny-llama, dataset: tiny-corpus, seq_length: 32, micro_batch: 2, steps: 4, warmup_steps: 1,
   dtype: fp32, gpus: 2, seed: 42, torch_adam: true, lr: 0.001, zero_stage: 1, ds_config: parity.json,
   hung_after_s: 300}
conditions:
  - {name: base}
  - {name: lr2x, lr: 0.002}                    # a wrong learning rate
  - {name: nan, lr: 1.0e+30, steps: 300}       # blows up to NaN, then would run on for 300 steps
  # verify's own view of a doubled learning rate, for the step it reports (loss_within_tol)
  - {name: vfy, kind: verify, extra_args: ["--inject", "lr"], atol: 1.0e-6}
baseline: base
guard: {atol: 1.0e-6, stop_on: [nan]}
"""


def _first_departing_step(a: dict[int, float], b: dict[int, float], atol: float) -> int | None:
    return next((s for s in sorted(a) if s in b and not abs(a[s] - b[s]) <= atol), None)


@pytest.mark.e2e
@pytest.mark.anyio
async def test_wrong_lr_is_flagged_live_and_nan_stops_the_run(tui_env) -> None:  # noqa: F811
    """One `dstui run` (4 tiny DeepSpeed jobs, 2 CPU ranks), watched by the TUI while it runs."""
    import os
    import subprocess
    import sys

    from rich.text import Text

    from dstui.core.records import read_records
    from dstui.core.rundir import BatchDir
    from dstui.tui.app import DstuiApp

    spec = tui_env / "guard.yaml"
    spec.write_text(GUARD_SPEC)
    proc = subprocess.Popen([sys.executable, "-m", "dstui", "run", str(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ))  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not list((tui_env / "runs").glob("guard-e2e-*/batch.json")) and time.monotonic() < deadline:
            time.sleep(0.2)
        b = BatchDir(next((tui_env / "runs").glob("guard-e2e-*")))
        app = DstuiApp(batch_id=b.id, supervise=False, watch_s=0.3)
        async with app.run_test(size=(160, 40)) as pilot:
            screen = app.screen

            def red(name: str) -> bool:
                row = screen._rows.get(name)
                return row is not None and isinstance(row[1], Text) and row[1].style == "bold red"

            # the TUI shows the flag while the batch is still going (nan and vfy come later)
            assert await wait_for(pilot, lambda: red("lr2x-r0"), timeout=400), screen._rows
            assert b.info().get("finalized") is not True
            assert str(screen._rows["lr2x-r0"][-1]).startswith("diverged at step 2 (Δ=")
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out  # the NaN run was killed, the verify run failed on purpose

    runs = {rd.name: rd for rd in b.runs()}
    losses = {n: losses_from_records(read_records(rd.metrics_file)) for n, rd in runs.items()}
    departs = _first_departing_step(losses["lr2x-r0"], losses["base-r0"], 1e-6)
    verify_step = next(r["step"] for r in read_records(runs["vfy-r0"].metrics_file)
                       if r["type"] == "step" and not r["loss_within_tol"])  # fmt: skip
    assert departs == verify_step == 2
    flag = runs["lr2x-r0"].status()["diverged"]
    assert flag["step"] == departs and flag["kind"] == "divergence"
    assert flag["delta"] == pytest.approx(losses["lr2x-r0"][2] - losses["base-r0"][2])
    assert runs["lr2x-r0"].state == "done"  # divergence is flagged, not stopped (stop_on: [nan])
    assert "lr2x-r0  done  4/4" in out and f"diverged at step 2 (Δ={flag['delta']:+.4g})" in out
    assert "diverged" not in str(runs["base-r0"].status())
    assert "diverged" not in str(runs["vfy-r0"].status())  # another runner's curve: NaN check only

    nan = runs["nan-r0"].status()
    assert nan["state"] == "killed" and nan["reason"] == "diverged at step 2 (loss=nan)"
    assert nan["steps_done"] < 300  # ended early
    assert "nan-r0  killed" in out

    from conftest import mlflow_client

    client = mlflow_client()
    exp = client.get_experiment_by_name("guard-e2e")
    tagged = {r.data.tags["dstui.condition"]: r for r in client.search_runs([exp.experiment_id], "tags.`dstui.role` = 'run'")}
    assert tagged["lr2x"].data.tags["dstui.diverged"] == f"step 2 (Δ={flag['delta']:+.4g})"
    assert tagged["nan"].info.status == "KILLED"
    assert tagged["nan"].data.tags["dstui.reason"] == "diverged at step 2 (loss=nan)"
    assert "dstui.diverged" not in tagged["base"].data.tags


@pytest.mark.parametrize(
    ("guard", "message"),
    [
        ("{baseline: nope, atol: 0.1}", "field 'guard.baseline': no condition 'nope'; conditions: a, b"),
        ("{rtol: 0.1}", "field 'guard': a loss tolerance needs a baseline condition"),
        ("{stop_on: [oom]}", "field 'guard.stop_on.0'"),
    ],
)
def test_bad_guard_settings_are_one_line_errors(home, guard: str, message: str) -> None:  # noqa: ANN001
    from conftest import dstui

    spec = home / "g.yaml"
    spec.write_text(f"name: g\nconditions: [{{name: a}}, {{name: b}}]\nguard: {guard}\n")
    proc = dstui("list", "--no-validate", str(spec))
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def _run_folder(batch, name: str, condition: str, kind: str, losses: list[float], state: str) -> None:  # noqa: ANN001
    import json

    from dstui.core.rundir import RunDir, write_json_atomic

    rd = RunDir(batch / name)
    write_json_atomic(rd.spec_file, {"condition": condition, "revision": "installed", "repeat": 0,
                                     "settings": {"kind": kind}})  # fmt: skip
    rd.metrics_file.write_text("".join(json.dumps({"type": "step", "step": i + 1, "loss": x}) + "\n"
                                       for i, x in enumerate(losses)))  # fmt: skip
    rd.update_status(name=name, state=state)


def test_batch_guard_reads_the_baseline_from_disk_and_survives_a_takeover(tmp_path) -> None:  # noqa: ANN001
    from dstui.core.records import read_records
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
        rd = RunDir(path / name)
        for rec in read_records(rd.metrics_file):
            guards.observe(rd, rec)
        return guards.check(rd)

    guards = BatchGuard(b)
    assert feed(guards, "lr-r0") is None  # step 3 waits for the baseline's step 3
    assert feed(guards, "vfy-r0") is None  # another kind: no comparison with a train curve
    with open(path / "base-r0" / "metrics.jsonl", "a") as fh:
        fh.write('{"type": "step", "step": 3, "loss": 5.2}\n')
    flag = guards.check(RunDir(path / "lr-r0"))
    assert flag is not None and flag.step == 3 and flag.baseline == 5.2
    RunDir(path / "lr-r0").update_status(diverged=flag.as_dict())  # as the supervisor does
    # a new supervisor re-reads nothing old, and never flags the run twice
    again = BatchGuard(b)
    assert feed(again, "lr-r0") is None and again.guard(RunDir(path / "lr-r0")).flag == flag
