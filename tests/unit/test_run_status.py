"""The run record: typed reading of status.json, and the named transitions that alone write a state."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstui.core import run_status
from dstui.core.run_status import RunStatus
from dstui.core.rundir import FINAL_STATES, RunDir, merge_status


def fresh(tmp_path: Path) -> RunDir:
    rd = RunDir(tmp_path / "b" / "r0")
    rd.path.mkdir(parents=True)
    return rd


def test_a_run_goes_queued_starting_running_done_through_its_transitions(tmp_path: Path) -> None:
    rd = fresh(tmp_path)
    q = run_status.queued(rd, name="r0", condition="c", revision="installed", repeat=0, key="k", order=0, steps_total=5)
    assert (q.state, q.steps_done, q.steps_total, q.name, q.is_active) == ("queued", 0, 5, "r0", True)
    before = time.time()
    s = run_status.starting(rd, executor="local")
    assert (s.state, s.executor, s.phase) == ("starting", "local", "launching")
    assert s.starting is not None and s.starting >= before and s.get("phase_since") == s.starting
    started = time.time()
    r = run_status.running(rd, pid=123, pgid=123, started=started)
    assert (r.state, r.is_live, r.get("pid"), r.started) == ("running", True, 123, started)
    e = run_status.ended(rd, run_status.DONE, None, exit_code=0, signal=None)
    assert (e.state, e.reason, e.exit_code, e.is_final) == ("done", None, 0, True)
    assert e.ended is not None and e.ended >= r.started
    # what the file holds is what a reader of any version sees: the same plain keys as before
    on_disk = json.loads(rd.status_file.read_text())
    assert on_disk["state"] == "done" and on_disk["name"] == "r0" and on_disk["pid"] == 123 and "updated" in on_disk
    assert RunStatus.of(rd) == e


def test_a_state_is_written_only_through_a_transition(tmp_path: Path) -> None:
    rd = fresh(tmp_path)
    run_status.queued(rd, name="r0", condition="c", revision="i", repeat=0, key="k", order=0, steps_total=1)
    with pytest.raises(ValueError, match="run_status"):
        rd.update_status(state="running")
    with pytest.raises(ValueError, match="run_status"):
        rd.update_status(**{"state": "done", "reason": None})  # a splat of a dict that carries one too
    assert rd.state == "queued"
    rd.update_status(phase="importing")  # any other field is a plain update
    assert RunStatus.of(rd).phase == "importing"


@pytest.mark.parametrize("state", ["queued", "running", "skipped", "unknown"])
def test_ended_takes_only_an_ending(tmp_path: Path, state: str) -> None:
    with pytest.raises(ValueError, match="ends"):
        run_status.ended(fresh(tmp_path), state, "x")


@pytest.mark.parametrize("state", sorted(FINAL_STATES))
def test_a_scheduler_never_ends_a_run_by_moving_it(tmp_path: Path, state: str) -> None:
    with pytest.raises(ValueError, match="scheduler"):
        run_status.moved_by_scheduler(fresh(tmp_path), state)


def test_requeued_starts_a_new_attempt_from_zero_and_keeps_what_is_kept(tmp_path: Path) -> None:
    rd = fresh(tmp_path)
    merge_status(rd, {"state": "failed", "reason": "boom", "steps_done": 3, "name": "r0", "attempt": 1})
    st = run_status.requeued(rd, attempt=2, name="r0", key="k", earlier_attempts=[{"attempt": 1}])
    assert (st.state, st.steps_done, st.attempt, st.name, st.get("earlier_attempts")) == ("queued", 0, 2, "r0", [{"attempt": 1}])


def test_skipped_and_cancelled_before_start_say_why_and_when(tmp_path: Path) -> None:
    a, b = fresh(tmp_path / "a"), fresh(tmp_path / "b")
    sk = run_status.skipped(a, "predicted OOM: 90 GiB on an 80 GiB GPU")
    assert (sk.state, sk.reason, sk.is_final) == ("skipped", "predicted OOM: 90 GiB on an 80 GiB GPU", True)
    assert sk.ended is not None
    k = run_status.cancelled_before_start(b)
    assert (k.state, k.reason) == ("killed", run_status.CANCELLED_BEFORE_START)


def test_waiting_is_queued_with_the_schedulers_words(tmp_path: Path) -> None:
    st = run_status.waiting(fresh(tmp_path), "Slurm: PENDING (Priority)", job_id="42", slurm_state="PENDING")
    assert (st.state, st.reason, st.job_id, st.get("slurm_state")) == ("queued", "Slurm: PENDING (Priority)", "42", "PENDING")


def test_an_old_status_reads_typed_and_keeps_every_field(tmp_path: Path) -> None:
    """A status.json as a dstui of months ago wrote it: no executor, no attempt, fields this version never names."""
    rd = fresh(tmp_path)
    old = {"name": "r0", "condition": "z1", "revision": "installed", "repeat": 0, "key": "k", "order": 0,
           "state": "done", "steps_total": 10, "steps_done": 10, "pid": 7, "started": 100.0, "ended": 160.5,
           "exit_code": 0, "last": {"loss": 1.5, "iter_time": 0.2}, "mlflow_run_id": "abc", "legacy_flag": True}  # fmt: skip
    rd.status_file.write_text(json.dumps(old))
    st = RunStatus.of(rd)
    assert (st.state, st.steps_done, st.started, st.ended, st.exit_code, st.attempt) == ("done", 10, 100.0, 160.5, 0, 1)
    assert st.executor is None and st.last["loss"] == 1.5 and st.get("legacy_flag") is True and st.began == 100.0


def test_a_missing_or_foreign_status_is_unknown(tmp_path: Path) -> None:
    rd = fresh(tmp_path)
    assert RunStatus.of(rd).state == "unknown"
    rd.status_file.write_text('["not", "a", "status"]')
    assert RunStatus.of(rd) == RunStatus()


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
KEYS = st.sampled_from(["state", "reason", "steps_done", "steps_total", "started", "ended", "exit_code", "signal",
                        "attempt", "job_id", "last", "summary", "phase", "mlflow_run_id", "executor", "other"])  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(KEYS, JSON, max_size=12))
def test_any_json_a_job_may_write_reads_as_declared_types(d: dict) -> None:
    """The folder is the job's too: whatever it holds, typed fields are their type or None, never a traceback."""
    s = RunStatus.from_dict(d)
    assert isinstance(s.state, str) and isinstance(s.attempt, int)
    for name in ("steps_done", "steps_total", "exit_code", "signal"):
        assert getattr(s, name) is None or type(getattr(s, name)) is int
    for name in ("started", "ended", "starting"):
        assert getattr(s, name) is None or type(getattr(s, name)) is float
    for name in ("reason", "phase", "mlflow_run_id", "executor", "job_id"):
        assert getattr(s, name) is None or isinstance(getattr(s, name), str)
    assert dict(s.last) == (d["last"] if isinstance(d.get("last"), dict) else {})
