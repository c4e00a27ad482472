"""The runs screen's bisect line: hidden without a bisect, live from progress.json, the answer after."""

from __future__ import annotations

import os
import time

import pytest
from tui_helpers import wait_for

from dstui.bisect.store import Store, write_progress
from dstui.spec.settings import Settings
from dstui.tui.app import DstuiApp
from dstui.tui.home_snapshot import shown_bisects as shown
from dstui.tui.widgets.bisect_progress import BisectProgress, progress_text

pytestmark = pytest.mark.anyio
SHA = "c0ffee" + "0" * 34


def _progress(state: str = "running", **extra: object) -> dict:
    return {
        "id": "s", "pid": os.getpid(), "state": state, "metric": "loss", "condition": "z0", "commits": 4, "left": 3,
        "current": {"sha": SHA, "subject": "engine: faster step", "batch": "bisect-test-20261123-120000"},
        "tested": [{"sha": "abad1dea" * 5, "verdict": "skip"}], **extra,
    }  # fmt: skip


def test_progress_text_and_what_is_shown() -> None:
    text = progress_text(_progress()).plain
    assert "bisect loss of z0" in text and "3 outcomes left in 4 commits" in text
    assert "testing c0ffee000000 'engine: faster step' (batch bisect-test-20261123-120000)" in text
    assert "tested: abad1dea skip" in text
    done = _progress("done", answer="first bad commit: c0ffee000000 'x': +12%", updated=time.time())
    assert progress_text(done).plain.endswith("first bad commit: c0ffee000000 'x': +12%")
    dead = _progress(pid=2**22 + 12345)  # no such process: a killed bisect is not shown as running
    old = _progress("done", updated=time.time() - 3600)
    assert shown([_progress(), dead, old, done]) == [_progress(), done]


async def test_runs_screen_shows_a_running_bisect(tui_env) -> None:  # noqa: ANN001
    app = DstuiApp(supervise=False)
    async with app.run_test(size=(120, 30)) as pilot:
        widget = app.screen.query_one(BisectProgress)
        await pilot.pause(0.3)
        assert not widget.display  # no bisect: the screen looks as before
        store = Store.for_condition(tui_env / "runs", "bisect-test", "z0", Settings())
        session = store.session_dir("a" * 40, "b" * 40, "loss")
        write_progress(session, _progress())
        assert await wait_for(pilot, lambda: widget.display, timeout=10)
        assert "testing c0ffee000000" in str(widget.render())
        write_progress(session, _progress("done", answer="first bad commit: c0ffee000000 'engine: faster step'"))
        assert await wait_for(pilot, lambda: "first bad commit" in str(widget.render()), timeout=10)


def test_release_walk_progress_names_phase_estimate_and_path() -> None:
    walk = _progress(noun="release", commits=5, left=4, tests_left=2, phase="building",
                     current={"index": 2, "sha": "pypi-0.18.2", "name": "0.18.2", "subject": "DeepSpeed 0.18.2 (PyPI)",
                              "batch": None},
                     path=[{"sha": "pypi-0.18.3", "name": "0.18.3", "verdict": "bad"},
                           {"sha": "pypi-0.18.1", "name": "0.18.1", "verdict": "good"}])  # fmt: skip
    text = progress_text(walk).plain
    assert "4 outcomes left in 5 releases, about 2 more tests" in text
    assert "building env of 0.18.2 'DeepSpeed 0.18.2 (PyPI)'" in text and "batch" not in text
    assert "path: 0.18.3 bad -> 0.18.1 good" in text
    running = progress_text(_progress(phase="running", tests_left=1, current={"index": -1, "sha": SHA, "batch": "b1"})).plain
    assert "running c0ffee000000 '' (the good end) (batch b1)" in running
