"""Issue 14's memory forecast on the compose screen; issue 12's time view, GPUs column and launch default."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml
from helpers import HEAVY
from rich.text import Text
from textual.widgets import DataTable, Static
from tui_helpers import add_phases, fixture_batch, wait_for

from dstui.core.rundir import RunDir
from dstui.execute.gpu_share import AUTO
from dstui.tui.app import DstuiApp
from dstui.tui.screens.compose import ComposeScreen
from dstui.tui.screens.live import LiveScreen
from dstui.tui.screens.runs import RunsScreen
from dstui.tui.widgets.time_bar import TimeBar

pytestmark = pytest.mark.anyio

# llama-1b on 2 GPUs against a declared 30 GiB GPU: the machine running the test does not matter
GRID = {
    "name": "mem",
    "settings": {"model": "llama-1b", "seq_length": 2048, "dtype": "bf16", "gpus": 2, "steps": 4},
    "axes": {"zero_stage": [0, 3], "micro_batch": [1, 4]},
    "gpu_memory_gib": 30,
}


async def compose_forecast(tmp: Path, name: str, spec: dict) -> tuple[dict[str, Text], str, list]:
    """Open the spec in Compose, wait for its check: (mem/GPU cell per run, the forecast note, the runs).

    A screenshot of the screen is left in ``tmp/<name>.svg``.
    """
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    app = DstuiApp(spec_path=path, supervise=False)
    async with app.run_test(size=(140, 34)) as pilot:
        await pilot.press("1")
        screen = app.screen
        assert isinstance(screen, ComposeScreen)
        note = screen.query_one("#memnote", Static)
        assert await wait_for(pilot, lambda: "memory forecast" in str(note.render()), timeout=180), str(note.render())
        table = screen.query_one("#runlist", DataTable)
        cells = {str(key.value): table.get_cell(key, "mem/GPU") for key in table.rows}
        await pilot.pause(0.3)
        app.save_screenshot(filename=f"{name}.svg", path=str(tmp))
        return cells, str(note.render()), list(screen.runs)


@HEAVY
async def test_compose_forecast_per_run_coloured_against_the_declared_gpu(tui_env) -> None:  # noqa: ANN001
    from dstui.analysis import forecast
    from dstui.spec import dsconfig

    cells, note, runs = await compose_forecast(tui_env, "mem", GRID)
    assert "against 30.0 GiB" in note
    # the numbers: DeepSpeed's estimators + the analytic activations, with each run's ds_config
    configs = dsconfig.build_and_validate(runs, file=str(tui_env / "mem.yaml"), spec_dir=tui_env)
    for run in runs:
        fc = forecast.forecast(run.settings, ds_config=configs[run.name])
        assert str(cells[run.name]) == forecast.column(fc, 30 * 2**30), run.name
    # the colours: 31.6 GiB does not fit 30, 27.6 is within 10% of it, the rest (24.8, 14.9) fit
    assert str(cells["z0-mb4-r0"]).endswith(" GiB OOM") and cells["z0-mb4-r0"].style == "bold red"
    assert str(cells["z3-mb4-r0"]).endswith(" GiB !") and cells["z3-mb4-r0"].style == "bold yellow"
    assert cells["z0-mb1-r0"].style == "green" and cells["z3-mb1-r0"].style == "green"
    assert float(str(cells["z3-mb1-r0"]).split()[0]) < float(str(cells["z0-mb1-r0"]).split()[0])  # ZeRO-3 shards


async def test_compose_forecast_without_a_gpu_is_uncoloured_with_a_note(tui_env) -> None:  # noqa: ANN001
    from dstui.execute import sysmetrics

    if sysmetrics.gpu_memory_total() is not None:
        pytest.skip("this machine has a GPU: the forecast is held against it")
    spec = {**GRID, "axes": {"zero_stage": [0, 3]}}
    spec.pop("gpu_memory_gib")
    cells, note, _ = await compose_forecast(tui_env, "cpu", spec)
    assert "no GPU here and no gpu_memory_gib in the spec: not checked for OOM" in note
    assert set(cells) == {"z0-r0", "z3-r0"}
    for cell in cells.values():
        assert str(cell).endswith(" GiB") and not cell.style  # a number, no colour, no OOM verdict


@HEAVY
async def test_compose_forecast_of_a_command_run_is_a_dash(tui_env) -> None:  # noqa: ANN001
    cells, _, _ = await compose_forecast(tui_env, "cmd", {
        "name": "cmd", "settings": {"kind": "command", "steps": 4, "warmup_steps": 1}, "gpu_memory_gib": 30,
        "conditions": [{"name": "echo", "command": ["{python}", "-c", "print(1)"]}],
    })  # fmt: skip
    assert {k: str(v) for k, v in cells.items()} == {"echo-r0": "-"}


async def test_runs_screen_shows_gpus_and_where_the_time_went(tui_env) -> None:  # noqa: ANN001
    b = fixture_batch(tui_env)
    add_phases(b.path / "z0-r0", gpu_slice=[0, 1])
    add_phases(b.path / "z1-r0", gpu_slice=[2, 3])
    app = DstuiApp(batch_id=b.id, supervise=False, watch_s=0.3)
    async with app.run_test(size=(120, 34)) as pilot:
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        assert await wait_for(pilot, lambda: "z1-r0" in screen._rows, timeout=20)
        assert [screen._rows[n][9] for n in ("z0-r0", "z1-r0", "z2-r0", "z3-r0")] == ["0,1", "2,3", "-", "-"]
        bar = screen.query_one(TimeBar)
        text = str(bar.render())
        assert bar.display
        assert "time z0-r0  58.0 s " in text and "steps 3% of wall" in text
        for seg in ("launch 2.0", "imports 3.0", "init 4.0", "compile 1.5", "steps 39.5", "teardown 8.0"):
            assert seg in text
        # two runs' 2.0 s of steps over the batch's first start -> last end (60 s, the failed runs included)
        assert "step share 7%: 4.0 s of optimizer steps in 60.0 s of wall time" in text
        app.save_screenshot(filename="runs_times.svg", path=str(tui_env))
        # a run without a breakdown (it failed before its runner wrote one): the batch's share only
        await pilot.press("down", "down")
        assert await wait_for(pilot, lambda: "time z2-r0" not in str(bar.render()) and "time z0" not in str(bar.render()))
        assert "step share 7%" in str(bar.render())
        # the live view's log title has a small bar of where the focused run's time went
        await pilot.press("up", "up", "v")
        assert await wait_for(pilot, lambda: isinstance(app.screen, LiveScreen), timeout=10)
        title = app.screen.query_one("#log-title", Static)
        want = "log z0-r0  (n: next run, o: full log)  time 58.0 s " + "█" * 20 + "  steps 3% of wall"
        assert await wait_for(pilot, lambda: str(title.render()) == want, timeout=20), str(title.render())


async def test_time_bar_stays_hidden_for_a_batch_without_breakdowns(tui_env) -> None:  # noqa: ANN001
    b = fixture_batch(tui_env)
    app = DstuiApp(batch_id=b.id, supervise=False, watch_s=0.3)
    async with app.run_test(size=(120, 34)) as pilot:
        assert await wait_for(pilot, lambda: "z3-r0" in app.screen._rows, timeout=20)
        await pilot.pause(0.5)
        assert not app.screen.query_one(TimeBar).display


def test_the_tui_launches_with_the_cli_default_parallel() -> None:
    """`dstui tui` and `dstui run` agree: auto (runs share the box on disjoint GPUs)."""
    from dstui.commands import run as run_cmd
    from dstui.commands import tui as tui_cmd

    defaults = []
    for mod in (run_cmd, tui_cmd):
        p = argparse.ArgumentParser()
        mod.add_arguments(p)
        defaults.append(p.parse_args(["x.yaml"]).parallel)
    assert defaults == [AUTO, AUTO]
    assert DstuiApp().options.parallel == AUTO


async def test_runs_columns_widen_for_gpus_given_after_the_table_was_built(tui_env) -> None:  # noqa: ANN001
    """A run that starts later gets its GPUs; the column grows to show all of them, not the header's width."""
    from dstui.core.rundir import RunDir
    from dstui.tui.widgets.cached_table import CachedTable

    b = fixture_batch(tui_env)
    app = DstuiApp(batch_id=b.id, supervise=False, watch_s=0.3)
    async with app.run_test(size=(140, 34)) as pilot:
        assert await wait_for(pilot, lambda: "z3-r0" in app.screen._rows, timeout=20)
        table = app.screen.query_one("#runs", CachedTable)
        gpus = table.ordered_columns[9]  # the table sizes its own columns (DataTable's widths came late: issue 38.3)
        assert str(gpus.label) == "gpus" and gpus.width < len("0,1,2,3,4,5,6,7")
        RunDir(b.path / "z3-r0").update_status(gpu_slice=list(range(8)), reason="CUDA error: an illegal memory access")
        assert await wait_for(pilot, lambda: app.screen._rows["z3-r0"][9] == "0,1,2,3,4,5,6,7", timeout=20)
        assert await wait_for(pilot, lambda: table.ordered_columns[9].width == len("0,1,2,3,4,5,6,7"), timeout=20)
        reason = table.ordered_columns[10]
        assert reason.width == len("CUDA error: an illegal memory access")


async def test_time_bar_says_how_the_compile_caches_answered(tui_env) -> None:  # noqa: ANN001
    b = fixture_batch(tui_env)
    add_phases(b.path / "z0-r0")
    add_phases(b.path / "z1-r0")
    RunDir(b.path / "z0-r0").update_status(summary={"compile_time": 1.5, "compile_cache_fxgraph_hit": 1,
                                                     "compile_cache_fxgraph_miss": 1})  # fmt: skip
    app = DstuiApp(batch_id=b.id, supervise=False, watch_s=0.3)
    async with app.run_test(size=(120, 34)) as pilot:
        screen = app.screen
        assert await wait_for(pilot, lambda: "z1-r0" in screen._rows, timeout=20)
        bar = screen.query_one(TimeBar)
        assert await wait_for(pilot, lambda: "compile cache Inductor graphs 1 hit, 1 miss" in str(bar.render()))
        await pilot.press("down")  # z1-r0 compiled nothing: its time, no cache line
        assert await wait_for(pilot, lambda: "time z1-r0" in str(bar.render()))
        assert "compile cache" not in str(bar.render())
