"""The Runs screen renders the app's snapshots of the runs home (issue 39.4) and shows what they hold.

One app worker reads the run folders and posts immutable snapshots; the screen shows exactly
what the newest one holds, follows a run that changes, hears of a failure, and its UI thread
opens no file while it watches (the frame-time measurement is benchmarks/tui_ui_thread.py).
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tui_helpers import T0, fixture_batch, home_shown, wait_for, write_run

from dstui.core.rundir import BatchDir, RunDir, merge_status, write_json_atomic
from dstui.tui.app import DstuiApp
from dstui.tui.screens.live import LiveScreen
from dstui.tui.screens.runs import RunsScreen

pytestmark = pytest.mark.anyio


def batch(home: Path, bid: str, runs: list[tuple[str, str]], *, steps: int = 20, created: float = T0,
          finalized: bool = True) -> BatchDir:  # fmt: skip
    path = home / "runs" / bid
    path.mkdir(parents=True)
    for i, (name, state) in enumerate(runs):
        write_run(path, name, order=i, state=state, steps=steps)
    write_json_atomic(path / "batch.json", {"id": bid, "experiment": "fixture", "runs": [n for n, _ in runs],
                                            "created": created, "finalized": finalized})  # fmt: skip
    return BatchDir(path)


def shown_text(app: DstuiApp) -> str:
    """The whole screen as the terminal would get it, escape sequences left out."""
    frame = app.screen._compositor.render_update(full=True).render_segments(app.console)
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", frame)


def rows_of(screen: RunsScreen) -> dict[str, list[str]]:
    return {k: [str(c) for c in v] for k, v in screen._rows.items()}


async def test_the_runs_screen_shows_what_the_snapshot_holds(tui_env: Path) -> None:
    batch(tui_env, "old-20260101-000000", [("a-r0", "done")], created=T0)
    live = batch(tui_env, "live-20260101-000100", [("x-r0", "running"), ("y-r0", "queued")], created=T0 + 60, finalized=False)
    app = DstuiApp(supervise=False, watch_s=0.2)
    async with app.run_test(size=(120, 36)) as pilot:
        assert await home_shown(pilot)
        screen = app.screen
        home = app.home
        assert [b.id for b in home.batches] == [live.id, "old-20260101-000000"]  # newest first
        assert list(screen.query_one("#batches").cells) == [b.id for b in home.batches]
        view = home.batch(live.id)
        assert screen.batch is not None and screen.batch.path == view.path  # the newest is shown
        assert list(screen._rows) == [r.name for r in view.runs]
        for r in view.runs:
            assert rows_of(screen)[r.name][2] == r.status["state"]
        assert not view.supervised and str(screen.query_one("#batches").cells[live.id][2]) == "unsupervised"
        # immutable: a screen cannot change what the next frame, or another screen, shows
        with pytest.raises(TypeError):
            view.runs[0].status["state"] = "done"  # type: ignore[index]
        with pytest.raises(TypeError):
            view.runs[0].status["last"]["loss"] = 0.0  # type: ignore[index]
        with pytest.raises(AttributeError):
            view.supervised = True  # type: ignore[misc]


async def test_the_runs_screen_follows_a_run_that_changes_and_hears_of_a_failure(tui_env: Path) -> None:
    live = batch(tui_env, "live-20260101-000100", [("x-r0", "running"), ("y-r0", "queued")], finalized=False)
    x, y = RunDir(live.path / "x-r0"), RunDir(live.path / "y-r0")
    app = DstuiApp(batch_id=live.id, supervise=False, watch_s=0.2)
    async with app.run_test(size=(120, 36)) as pilot:
        assert await home_shown(pilot)
        screen = app.screen
        assert rows_of(screen)["x-r0"][3] == "0/20"
        x.update_status(steps_done=7, last={"loss": 1.25, "iter_time": 0.5, "tokens_per_s": 10.0})
        assert await wait_for(pilot, lambda: rows_of(screen)["x-r0"][3] == "7/20", timeout=20), rows_of(screen)
        assert rows_of(screen)["x-r0"][5] == "1.25" and rows_of(screen)["x-r0"][6] == "0.500"  # a live run: its last step
        merge_status(y, dict(state="failed", reason="Python: RuntimeError: boom"))
        assert await wait_for(pilot, lambda: rows_of(screen)["y-r0"][2] == "failed", timeout=20)
        assert await wait_for(pilot, lambda: any(n.title == "run failed" and "y-r0" in n.message
                                                 for n in app._notifications), timeout=20)  # fmt: skip
        # a batch launched by another process: listed within the relisting interval
        later = batch(tui_env, "new-20260101-000200", [("z-r0", "queued")], created=time.time(), finalized=False)
        assert await wait_for(pilot, lambda: later.id in screen.query_one("#batches").cells, timeout=30)
        assert screen.batch is not None and screen.batch.id == live.id  # the highlighted batch stays


def _file_calls_on(thread_id: int) -> tuple[list[str], Callable[[], object]]:
    """Python's audit events of file access made by one thread (the hook stays, switched off by the caller)."""
    seen: list[str] = []
    state = {"on": True}
    events = ("open", "os.listdir", "os.scandir", "fcntl.flock", "fcntl.lockf", "os.kill")

    def hook(event: str, args: tuple) -> None:
        if state["on"] and event in events and threading.get_ident() == thread_id:
            seen.append(f"{event} {str(args[0])[-80:] if args else ''}")

    sys.addaudithook(hook)
    return seen, lambda: state.update(on=False)


async def test_the_ui_thread_opens_no_file_while_it_watches(tui_env: Path) -> None:
    """Ten live batches change under it (written by another thread), the user moves through them: the
    UI thread (the one running the app's event loop) opens, lists and locks nothing."""
    for i in range(10):
        batch(tui_env, f"b{i}-20260101-0000{i:02d}", [(f"c{j}-r0", "running") for j in range(4)], created=T0 + i,
              finalized=False)  # fmt: skip
    app = DstuiApp(supervise=False, watch_s=0.2)
    async with app.run_test(size=(120, 36)) as pilot:
        assert await home_shown(pilot)
        await pilot.press("v")  # the Live view's modules and first reads: before the window
        assert await wait_for(pilot, lambda: isinstance(app.screen, LiveScreen), timeout=20)
        await pilot.pause(1.0)
        await pilot.press("escape")
        await pilot.pause(0.5)
        stop = threading.Event()

        def supervisors() -> None:
            step = 0
            while not stop.wait(0.1):
                step += 1
                for i in range(10):
                    RunDir(tui_env / "runs" / f"b{i}-20260101-0000{i:02d}" / "c0-r0").update_status(steps_done=step)

        writer = threading.Thread(target=supervisors, daemon=True)
        seen, off = _file_calls_on(threading.get_ident())
        writer.start()
        try:
            await pilot.press("shift+tab")
            for key in ["down"] * 5 + ["up"] * 3:
                await pilot.press(key)
                await pilot.pause(0.3)
        finally:
            off()
            stop.set()
            writer.join()
        assert seen == []
        assert app.screen.batch is not None  # it was watching all along


async def test_columns_fit_another_batch_after_live_and_escape(tui_env: Path) -> None:
    """Issue 38.3: Live -> Escape -> another batch kept the first batch's widths and cut `20/20` to `20/2`."""
    batch(tui_env, "short-20260101-000000", [("a-r0", "done"), ("b-r0", "done")], steps=8, created=T0 + 10)
    batch(tui_env, "lrsweep-20260101-000000", [("base-olmo-lr1e-4-r0", "done"), ("base-olmo-lr1e-3-r0", "failed")],
          steps=20, created=T0)  # fmt: skip
    app = DstuiApp(batch_id="short-20260101-000000", supervise=False, watch_s=0.2)
    async with app.run_test(size=(120, 36)) as pilot:
        assert await home_shown(pilot)
        screen = app.screen
        assert await wait_for(pilot, lambda: "a-r0" in screen._rows)
        await pilot.press("v")
        assert await wait_for(pilot, lambda: isinstance(app.screen, LiveScreen))
        await pilot.pause(0.5)
        await pilot.press("escape")
        await pilot.press("shift+tab")  # the batches table
        await pilot.press("down")
        assert await wait_for(pilot, lambda: "base-olmo-lr1e-4-r0" in screen._rows)
        await pilot.pause(0.3)
        text = shown_text(app)
        assert "base-olmo-lr1e-4-r0" in text and "base-olmo-lr1e-3-r0" in text
        assert re.search(r"base-olmo-lr1e-4-r0\s+done\s+20/20\s", text), text
        table = screen.query_one("#runs")
        for col, width in zip(table.ordered_columns, table.widths, strict=True):
            assert col.width == width and all(len(str(cells[table.ordered_columns.index(col)])) <= width
                                              for cells in table.cells.values())  # fmt: skip


async def test_a_reason_is_shown_as_text_never_as_markup(tui_env: Path) -> None:
    """A run's reason is its own: `[/x]` stopped the table from drawing, `[b]` turned bold."""
    b = fixture_batch(tui_env)
    rd = RunDir(b.path / "z2-r0")
    rd.update_status(reason="Python: ValueError: closing [/x] and [b]not bold[/b]")
    app = DstuiApp(batch_id=b.id, supervise=False, watch_s=0.2)
    async with app.run_test(size=(160, 36)) as pilot:
        assert await home_shown(pilot)
        await pilot.pause(0.3)
        assert "closing [/x] and [b]not bold[/b]" in shown_text(app)
