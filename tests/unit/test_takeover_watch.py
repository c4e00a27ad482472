"""The one takeover rule and the one batch watcher (dstui/usecases/takeover.py, watch.py), in one process.

Real batch folders and real flocks; the paths that start a supervisor are the e2e tests'
(tests/e2e/test_reliability.py: kill -9 and takeover; tests/tui/test_tui_runs.py: the TUI's).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dstui.core.rundir import BatchDir, RunDir, merge_status, write_json_atomic
from dstui.execute.batch_lock import BatchLock
from dstui.usecases import takeover, watch


def make_batch(root: Path, states: dict[str, str], *, finalized: bool, name: str = "t-20260101-000000") -> BatchDir:
    b = BatchDir(root / name)
    b.path.mkdir(parents=True)
    for i, (name, state) in enumerate(states.items()):
        reason = {"failed": "CUDA out of memory", "killed": "cancelled"}.get(state)
        merge_status(RunDir(b.path / name), dict(name=name, order=i, state=state, reason=reason, steps_done=0, steps_total=3))
    write_json_atomic(b.batch_file, {"id": b.id, "experiment": "t", "runs": list(states), "finalized": finalized})
    return b


def test_how_a_batch_is_looked_after_without_starting_anything(tmp_path: Path) -> None:
    unfinished = make_batch(tmp_path, {"x-r0": "queued"}, finalized=False, name="a-20260101-000000")
    done = make_batch(tmp_path, {"x-r0": "done"}, finalized=True, name="b-20260101-000000")
    held = make_batch(tmp_path, {"x-r0": "running"}, finalized=False, name="c-20260101-000000")
    lock = BatchLock(held)
    lock.acquire()  # a live supervisor's flock (another open file description: seen as held)
    try:
        verdicts = takeover.Takeover(enabled=False).look([unfinished, done, held])
    finally:
        lock.release()
    assert verdicts == {unfinished.id: takeover.NOT_RUNNING, done.id: takeover.FINISHED, held.id: takeover.SUPERVISED}
    assert not unfinished.log_file.exists()  # nothing was started


def test_a_supervisor_that_keeps_stopping_is_reported_not_restarted(tmp_path: Path) -> None:
    b = make_batch(tmp_path, {"x-r0": "queued"}, finalized=False)
    policy = takeover.Takeover(confirm_s=0, max_restarts=0)
    assert policy.look_one(b) == takeover.GAVE_UP
    assert not b.log_file.exists()  # no supervisor started
    assert policy.gave_up_note(b) == f"the supervisor stopped 1 times; see {b.log_file}"


def test_a_finalized_but_requeued_batch_needs_a_supervisor(tmp_path: Path) -> None:
    """finalized alone is not enough: a run queued again after the end (retry) needs someone."""
    b = make_batch(tmp_path, {"x-r0": "done", "y-r0": "queued"}, finalized=True)
    assert takeover.needs_supervisor(b)
    merge_status(RunDir(b.path / "y-r0"), dict(state="done"))
    assert not takeover.needs_supervisor(b)


def test_the_watcher_reports_changes_troubles_and_the_end(tmp_path: Path) -> None:
    b = make_batch(tmp_path, {"a-r0": "done", "b-r0": "failed", "c-r0": "killed", "d-r0": "skipped"}, finalized=True)
    events = list(watch.BatchWatcher(b, poll_s=0.01, takeover=takeover.Takeover(enabled=False)).events())
    changed = [e.run.name for e in events if isinstance(e, watch.RunChanged)]
    troubles = [e.text for e in events if isinstance(e, watch.Trouble)]
    assert changed == ["a-r0", "b-r0", "c-r0", "d-r0"]
    assert troubles == ["FAILED b-r0: CUDA out of memory", "KILLED c-r0: cancelled"]
    assert events[-1] == watch.Ended(finalized=True, waiting_points=None)
    assert sum(isinstance(e, watch.Ended) for e in events) == 1


def test_the_watcher_says_a_batch_note_once(tmp_path: Path) -> None:
    b = make_batch(tmp_path, {"a-r0": "done"}, finalized=True)
    b.update_info(tracking_problem="MLflow unreachable at sqlite:///x")
    events = list(watch.BatchWatcher(b, poll_s=0.01, takeover=takeover.Takeover(enabled=False)).events())
    assert [e.text for e in events if isinstance(e, watch.Note)] == ["MLflow unreachable at sqlite:///x"]


@pytest.mark.parametrize("key", [watch.change_key, lambda st: (st.get("state"), st.get("steps_done"))])
def test_a_run_is_reported_again_only_when_its_key_changes(tmp_path: Path, key) -> None:  # noqa: ANN001
    b = make_batch(tmp_path, {"a-r0": "queued"}, finalized=False)
    w = watch.BatchWatcher(b, poll_s=0.01, takeover=takeover.Takeover(enabled=False), key=key, step_every_s=None)
    it = w.events()
    first = next(it)
    assert isinstance(first, watch.RunChanged) and first.status["state"] == "queued"
    RunDir(b.path / "a-r0").update_status(phase="launching")  # not in the bisect key: no event for it
    merge_status(RunDir(b.path / "a-r0"), dict(state="done", steps_done=3))
    second = next(it)
    assert isinstance(second, watch.RunChanged) and second.status["state"] == "done"
    b.update_info(finalized=True)
    rest = list(it)
    assert not [e for e in rest if isinstance(e, watch.RunChanged)]  # nothing changed since
    assert rest[-1] == watch.Ended(finalized=True, waiting_points=None)
