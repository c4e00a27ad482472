"""Snapshots of the main screens at fixed sizes, from fixture folders with fixed times.

Update after an intended change: pytest tests/test_tui_snapshots.py --snapshot-update
"""

from __future__ import annotations

import shutil

import pytest
from helpers import HEAVY
from tui_helpers import (
    REPO,
    add_phases,
    fixture_batch,
    home_shown,
    make_store,
    wait_for,
    workers_done,
)

from dstui.tui.app import DstuiApp
from dstui.tui.widgets.charts import MetricPlot


async def compose_checked(pilot) -> None:  # noqa: ANN001
    """Open Compose and wait for its DeepSpeed check and memory forecast (they start after a pause in typing).

    Waited for by what the screen shows (the check's line is no longer 'pending'), not by a pause:
    under load 10-16 the check's timer had not fired after 1 s, so no worker was there to wait for
    and the snapshot caught 'DeepSpeed check: pending…' (issue 39)."""
    from textual.widgets import Static

    from dstui.tui.screens.compose import ComposeScreen

    await home_shown(pilot)
    await pilot.press("1")
    assert await wait_for(pilot, lambda: isinstance(pilot.app.screen, ComposeScreen), timeout=60)
    dsv = pilot.app.screen.query_one("#dsvalid", Static)
    assert await wait_for(pilot, lambda: str(dsv.render()).strip() and "pending" not in str(dsv.render()), timeout=120)
    await workers_done(pilot.app)
    await pilot.pause(0.3)


def test_snapshot_runs(tui_env, snap_compare):  # noqa: F811
    b = fixture_batch(tui_env)
    assert snap_compare(DstuiApp(batch_id=b.id, supervise=False), terminal_size=(100, 30), run_before=home_shown)


def test_snapshot_runs_80x24(tui_env, snap_compare):  # noqa: F811
    b = fixture_batch(tui_env)
    assert snap_compare(DstuiApp(batch_id=b.id, supervise=False), terminal_size=(80, 24), run_before=home_shown)


def test_snapshot_runs_times(tui_env, snap_compare):  # noqa: F811
    """The gpus column and the time bar of a run that has a breakdown, with the batch's step share."""
    b = fixture_batch(tui_env)
    add_phases(b.path / "z0-r0", gpu_slice=[0, 1])
    add_phases(b.path / "z1-r0", gpu_slice=[2, 3])
    assert snap_compare(DstuiApp(batch_id=b.id, supervise=False), terminal_size=(100, 30), run_before=home_shown)


def test_snapshot_live(tui_env, snap_compare):  # noqa: F811
    b = fixture_batch(tui_env)

    async def run_before(pilot) -> None:  # noqa: ANN001
        await home_shown(pilot)
        await pilot.press("v")
        screen = pilot.app.screen
        await wait_for(pilot, lambda: screen.query_one("#plot-loss", MetricPlot).point_count > 0, timeout=10)
        await wait_for(pilot, lambda: len(screen.query_one("#log-tail").lines) >= 30, timeout=10)
        await pilot.pause(0.3)

    app = DstuiApp(batch_id=b.id, supervise=False, watch_s=0.2)
    assert snap_compare(app, terminal_size=(100, 30), run_before=run_before)


def test_snapshot_log(tui_env, snap_compare):  # noqa: F811
    b = fixture_batch(tui_env)

    async def run_before(pilot) -> None:  # noqa: ANN001
        await home_shown(pilot)
        await pilot.press("o")
        await pilot.pause(0.3)

    assert snap_compare(DstuiApp(batch_id=b.id, supervise=False), terminal_size=(100, 30), run_before=run_before)


def test_snapshot_compose(tui_env, snap_compare):  # noqa: F811
    spec = tui_env / "smoke.yaml"
    shutil.copy(REPO / "configs/experiments/smoke.yaml", spec)

    assert snap_compare(DstuiApp(spec_path=spec, supervise=False), terminal_size=(100, 30), run_before=compose_checked)


def test_snapshot_compose_forecast(tui_env, snap_compare):  # noqa: F811
    """mem/GPU coloured against a declared 30 GiB GPU: fits (green), within 10% (yellow), OOM (red)."""
    spec = tui_env / "mem.yaml"
    spec.write_text(
        "name: mem\nsettings: {model: llama-1b, seq_length: 2048, dtype: bf16, gpus: 2, steps: 4}\n"
        "axes: {zero_stage: [0, 3], micro_batch: [1, 4]}\ngpu_memory_gib: 30\n"
    )
    assert snap_compare(DstuiApp(spec_path=spec, supervise=False), terminal_size=(100, 30), run_before=compose_checked)


@HEAVY
def test_snapshot_revision_editor(tui_env, snap_compare):  # noqa: F811
    spec = tui_env / "revs.yaml"
    spec.write_text(
        "name: revs\nsettings: {model: tiny-llama, steps: 4}\naxes: {zero_stage: [1, 2]}\n"
        "revisions:\n  - {name: stable, pypi: 0.18.0}\n  - {name: main, git: /src/DeepSpeed, ref: master}\n"
    )

    async def run_before(pilot) -> None:  # noqa: ANN001
        await compose_checked(pilot)
        await pilot.press("ctrl+e")
        await pilot.pause(0.3)

    assert snap_compare(DstuiApp(spec_path=spec, supervise=False), terminal_size=(100, 30), run_before=run_before)


@HEAVY
def test_snapshot_results(tui_env, snap_compare):  # noqa: F811
    make_store()

    async def run_before(pilot) -> None:  # noqa: ANN001
        await home_shown(pilot)
        await pilot.press("3")
        await wait_for(pilot, lambda: pilot.app.screen.results is not None, timeout=120)
        await pilot.pause(0.3)

    assert snap_compare(DstuiApp(supervise=False), terminal_size=(110, 30), run_before=run_before)


def test_snapshot_help(tui_env, snap_compare):  # noqa: F811
    fixture_batch(tui_env)

    async def run_before(pilot) -> None:  # noqa: ANN001
        await home_shown(pilot)
        await pilot.press("question_mark")

    assert snap_compare(DstuiApp(supervise=False), terminal_size=(100, 30), run_before=run_before)


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
