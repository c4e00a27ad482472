"""A Slurm run waiting in the queue: the runs screen shows Slurm's reason, as status.json has it."""

from __future__ import annotations

import pytest
from tui_helpers import T0, wait_for, write_run

from dstui.core.rundir import BatchDir, RunDir, write_json_atomic
from dstui.tui.app import DstuiApp
from dstui.tui.screens.runs import RunsScreen

pytestmark = pytest.mark.anyio


async def test_runs_screen_shows_slurm_pending_reason(tui_env):  # noqa: F811
    path = tui_env / "runs" / "sl-20260101-000000"
    write_run(path, "z0-r0", order=0, state="running")
    write_run(path, "z1-r0", order=1, state="queued", reason="Slurm: PENDING (Resources)")
    RunDir(path / "z1-r0").update_status(executor="slurm", job_id="42", slurm_state="PENDING")
    write_json_atomic(path / "batch.json", {"id": path.name, "experiment": "fixture", "runs": ["z0-r0", "z1-r0"],
                                            "created": T0, "executor": "slurm", "finalized": False})  # fmt: skip
    app = DstuiApp(batch_id=BatchDir(path).id, supervise=False, watch_s=0.3)
    async with app.run_test(size=(120, 30)) as pilot:
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        assert await wait_for(pilot, lambda: "z1-r0" in screen._rows, timeout=10)
        cells = [str(c) for c in screen._rows["z1-r0"]]
        assert cells[2] == "queued" and cells[-1] == "Slurm: PENDING (Resources)"
