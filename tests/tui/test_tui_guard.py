"""The divergence guard in the TUI (red row and legend), and the whole flow on real DeepSpeed runs."""

from __future__ import annotations

import re
import time

import pytest
from helpers import mlflow_client
from tui_helpers import fixture_batch, wait_for

from dstui.execute.guard import Flag, losses_from_records

pytestmark = pytest.mark.anyio

def _legend_text(screen) -> str:  # noqa: ANN001
    from textual.widgets import Static

    return str(screen.query_one("#legend", Static).render())


async def test_tui_rows_and_legend_turn_red_for_a_flagged_run(tui_env) -> None:  # noqa: ANN001
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
  - {name: vfy, kind: verify, dataset: synthetic, extra_args: ["--inject", "lr"], atol: 1.0e-6}
baseline: base
guard: {atol: 1.0e-6, stop_on: [nan]}
"""


def _first_departing_step(a: dict[int, float], b: dict[int, float], atol: float) -> int | None:
    return next((s for s in sorted(a) if s in b and not abs(a[s] - b[s]) <= atol), None)


@pytest.mark.e2e
@pytest.mark.xdist_group("guard")  # four real DeepSpeed runs: started early under xdist
async def test_wrong_lr_is_flagged_live_and_nan_stops_the_run(tui_env) -> None:  # noqa: ANN001
    """One `dstui run` (4 tiny DeepSpeed jobs, 2 CPU ranks), watched by the TUI while it runs."""
    import os
    import subprocess
    import sys

    from rich.text import Text

    from dstui.core.record_file import read_records
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
    assert re.search(r"lr2x-r0\s+done\s+4/4", out) and f"diverged at step 2 (Δ={flag['delta']:+.4g})" in out
    assert "diverged" not in str(runs["base-r0"].status())
    assert "diverged" not in str(runs["vfy-r0"].status())  # another runner's curve: NaN check only

    nan = runs["nan-r0"].status()
    assert nan["state"] == "killed" and nan["reason"] == "diverged at step 2 (loss=nan)"
    assert nan["steps_done"] < 300  # ended early
    assert re.search(r"nan-r0\s+killed", out)

    client = mlflow_client()
    exp = client.get_experiment_by_name("guard-e2e")
    tagged = {r.data.tags["dstui.condition"]: r for r in client.search_runs([exp.experiment_id], "tags.`dstui.role` = 'run'")}
    assert tagged["lr2x"].data.tags["dstui.diverged"] == f"step 2 (Δ={flag['delta']:+.4g})"
    assert tagged["nan"].info.status == "KILLED"
    assert tagged["nan"].data.tags["dstui.reason"] == "diverged at step 2 (loss=nan)"
    assert "dstui.diverged" not in tagged["base"].data.tags
