"""The TUI's Tune screen runs `dstui tune`'s own service: the same candidates, the same refusals.

Opened from the command palette's "Tune current spec" on a real spec: the
candidates and their predictions are those of `dstui tune --dry-run` (DeepSpeed
validates every candidate's config, as the CLI does); a spec whose space cannot
run here says why on screen in one line, and nothing starts. The search itself
(probes) is tests/e2e/test_tune_e2e.py's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tui_helpers import wait_for

from dstui.analysis.time_fit import seconds_label
from dstui.tui.app import DstuiApp
from dstui.tui.screens.tune import TuneScreen

pytestmark = pytest.mark.anyio

SPEC = """name: tune-tui
settings: {model: tiny-llama, seq_length: 64, gpus: 2, dtype: fp32, torch_adam: true, steps: 6, warmup_steps: 2}
tune:
  global_batch: 8
  space: {zero_stage: [0, 1, 2, 3], offload: [none, optimizer], micro_batch: [1, 2, 4],
          activation_checkpointing: [false], sequence_parallel: [1]}
"""


async def test_the_tune_screen_lists_what_dstui_tune_lists(tui_env: Path) -> None:
    spec = tui_env / "tune.yaml"
    spec.write_text(SPEC)
    cli = subprocess.run([sys.executable, "-m", "dstui", "tune", str(spec), "--dry-run", "--json"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    expected = {r["candidate"]: r for r in json.loads(cli.stdout)["candidates"]}
    app = DstuiApp(spec_path=spec, supervise=False, watch_s=0.3)
    async with app.run_test(size=(120, 36)) as pilot:
        app.tune_current()  # what the palette's "Tune current spec" calls
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, TuneScreen)
        table = screen.query_one("#tune-candidates")
        assert await wait_for(pilot, lambda: table.row_count == len(expected), timeout=240)
        for key in table.rows:
            name, step, _mem, status = (str(c) for c in table.get_row(key))
            want = expected[name]
            assert status == (want["left_out"] or "candidate")
            assert step == ("-" if want["predicted_s"] is None else f"~{seconds_label(want['predicted_s'])}")
        assert "optimizer offload needs ZeRO 1-3" in {str(table.get_row(k)[3]) for k in table.rows}
        status = str(screen.query_one("#tune-status").render())
        assert "24 candidates, 21 can run here" in status and "s: start the search" in status


async def test_a_space_that_cannot_run_here_says_why_and_starts_nothing(tui_env: Path) -> None:
    spec = tui_env / "tune.yaml"
    spec.write_text(SPEC.replace("activation_checkpointing: [false]", "activation_checkpointing: [false], deepcompile: [true]"))
    app = DstuiApp(spec_path=spec, supervise=False, watch_s=0.3)
    async with app.run_test(size=(120, 36)) as pilot:
        app.tune_current()
        await pilot.pause()
        status = app.screen.query_one("#tune-status")
        assert await wait_for(pilot, lambda: "✗" in str(status.render()), timeout=120)
        assert "no candidate of the tune space can run here" in str(status.render())
        assert "DeepCompile needs a CUDA GPU" in str(status.render())
        await pilot.press("s")
    assert not (tui_env / "runs").exists() or not any(p.name.startswith("tune-tui-tune") for p in (tui_env / "runs").iterdir())
