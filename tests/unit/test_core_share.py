"""CPU cores as one resource across batches (issue 38.2): who waits, what ran beside a run, what reports keep."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from dstui.core.rundir import RunDir, merge_status
from dstui.execute import core_share, gpu_ledger, overlap
from dstui.execute.gpu_ledger import Ended, Holder


def _holder(batch: str, run: str, cores: int, gpus: tuple[int, ...] = ()) -> Holder:
    return Holder(f"/runs/{batch}/{run}", batch, run, gpus, None, cores)


@pytest.mark.parametrize(
    ("settings", "total_gpus", "cores", "need"),
    [
        ({"gpus": 2}, 0, 2, 2),  # CPU ranks and torch's threads: the whole box
        ({"gpus": 1, "kind": "command"}, 0, 16, 16),  # a program dstui cannot see into: the same
        ({"gpus": 2}, 8, 64, 2),  # with GPUs: one core per local rank
        ({"gpus": 8}, 8, 4, 4),  # never more than there are
    ],
)
def test_cores_a_run_claims(settings: dict, total_gpus: int, cores: int, need: int) -> None:
    assert core_share.cores_needed(settings, total_gpus=total_gpus, cores=cores) == need


def test_a_claim_waits_only_while_it_does_not_fit() -> None:
    other = _holder("smoke-1", "z0-r0", 2)
    assert core_share.blocking([other], 2, 2) == [other]  # 2 + 2 > 2: wait
    assert core_share.blocking([], 2, 2) == []
    assert core_share.blocking([_holder("a", "r", 1)], 1, 2) == []  # 1 + 1 fits on 2
    # an entry older than core claims (cores 0, a GPU run) never blocks by cores
    assert core_share.blocking([_holder("gpu", "r", 0, (0,))], 2, 2) == []


def _run(tmp_path: Path, name: str = "a-r0", **status: Any) -> RunDir:
    rd = RunDir(tmp_path / "b-1" / name)
    rd.path.mkdir(parents=True)
    (rd.path / "spec.json").write_text('{"settings": {"warmup_steps": 2}}')
    merge_status(rd, dict(state="running", **status))
    return rd


def test_looks_record_every_other_run_and_the_steps_its_life_spanned(tmp_path: Path) -> None:
    rd = _run(tmp_path, started=100.0, steps_done=1, steps_total=10)
    beside = Holder("/runs/lrsweep-2/z1-r0", "lrsweep-2", "z1-r0", (), None, 2, 99.0)
    mine = Holder(str(rd.path), "b-1", "a-r0", (), None, 2, 100.0)
    for now, steps, load in ((101.0, 1, 3.0), (103.0, 4, 5.0), (105.0, 6, None)):
        rd.update_status(steps_done=steps)
        rd.update_status(**overlap.record(rd, rd.status(), [mine, beside], [], now, load, 2))
    st = rd.status()
    assert st[overlap.BESIDE] == {beside.run_path: {"batch": "lrsweep-2", "run": "z1-r0", "from": 100.0, "to": 105.0, "open": True}}
    assert str(rd.path) not in st[overlap.BESIDE]  # never beside itself
    assert st[overlap.TIMELINE] == [[101.0, 1], [103.0, 4], [105.0, 6]]
    assert st[overlap.HOST_LOAD] == {"mean": 4.0, "max": 5.0, "samples": 2, "cores": 2}
    # beside it since its launch, still there: step 1 to the step running now (7)
    summary = st[overlap.OVERLAP]
    assert summary["timed"] is True and summary["steps"] == [1, 7]
    assert summary["text"] == "steps 1-7 beside batch lrsweep-2 (run z1-r0); host load 4.0 mean, 5.0 max on 2 cores"
    # it ends with the other still beside it: to its last step
    done = {**st, "state": "done"}
    assert overlap.tags(done) == {"dstui.overlapped": "true",
                                  "dstui.overlap": "steps 1-10 beside batch lrsweep-2 (run z1-r0); host load 4.0 mean, 5.0 max on 2 cores"}


def test_a_run_that_started_and_ended_between_two_looks_is_found_in_the_recent_runs(tmp_path: Path) -> None:
    """The miss an earlier version had: the other run lived 1.2 s, between two looks; the ledger's recent runs keep it."""
    rd = _run(tmp_path, started=100.0, steps_done=2, steps_total=10)
    rd.update_status(timeline=[[100.0, 0], [102.0, 2]])
    short = Ended("/runs/x-1/fast-r0", "x-1", "fast-r0", 102.3, 103.5)
    rd.update_status(steps_done=5)
    seen = overlap.record(rd, rd.status(), [], [short, Ended("/old", "x-0", "r", 10.0, 20.0)], 104.0, None, 2)
    assert list(seen[overlap.BESIDE]) == ["/runs/x-1/fast-r0"]  # the one that ended before it started is not
    assert seen[overlap.BESIDE]["/runs/x-1/fast-r0"]["open"] is False
    # from the step running at the look before it began (3) to the one running at the first look after it ended (6)
    assert seen[overlap.OVERLAP]["steps"] == [3, 6] and seen[overlap.OVERLAP]["timed"] is True


def test_an_overlap_within_warm_up_leaves_the_timings_its_own() -> None:
    """Another run during start-up and the first step only: the timed steps (after warm-up 2) ran alone."""
    early = {"/x": {"batch": "b", "run": "r", "from": 100.0, "to": 101.0, "open": False}}
    s = overlap.summarize(early, [[100.5, 0], [101.2, 0], [102.0, 3]], {}, warmup=2, total=10, steps_now=3)
    assert (s.timed, s.steps) == (False, (1, 1)), s
    # the same, seen only by a look at step 3: taken wide, steps 1-4 (timed): a wrong "alone" is never claimed
    wide = overlap.summarize(early, [[100.5, 0], [102.0, 3]], {}, warmup=2, total=10, steps_now=3)
    assert (wide.timed, wide.steps) == (True, (1, 4)), wide
    alone = overlap.summarize({}, [], {"mean": 1.0, "max": 1.5, "samples": 3, "cores": 2}, warmup=2, total=10, steps_now=0)
    assert alone.timed is False and alone.text == "no other run beside it; host load 1.0 mean, 1.5 max on 2 cores"
    assert overlap.tags({}) == {}  # never looked at (a Slurm job): no claim either way


def test_a_waiting_batch_starts_beside_only_when_launched_to_overlap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The local backend's admission on a machine without GPUs, with another batch's live run in the ledger."""
    from dstui.core.rundir import BatchDir
    from dstui.execute.backends.local import LocalBackend

    monkeypatch.setenv("DSTUI_GPU_COUNT", "0")
    monkeypatch.setenv(gpu_ledger.LEDGER_ENV, str(tmp_path / "ledger"))
    other = RunDir(tmp_path / "runs" / "smoke-1" / "z0-r0")
    other.path.mkdir(parents=True)
    merge_status(other, dict(state="running", pgid=os.getpgid(0)))  # a live group: this test's own
    with gpu_ledger.opened() as ledger:
        ledger.add(other, [], core_share.machine_cores())
    mine = RunDir(tmp_path / "runs" / "lrsweep-2" / "a-r0")
    mine.path.mkdir(parents=True)
    (mine.path / "spec.json").write_text('{"settings": {"gpus": 2}}')
    merge_status(mine, dict(state="queued"))
    batch = BatchDir(mine.path.parent)
    started: list[RunDir] = []

    LocalBackend({"parallel": 0}).start_queued(batch, [mine], [], lambda rd, slot: started.append(rd))
    assert started == []
    assert mine.status()["phase"] == "waiting for cores used by batch smoke-1 (run z0-r0)"
    note = LocalBackend().launch_notes(batch)
    assert note == [f"cores busy: batch smoke-1 (run z0-r0) use this machine's {core_share.machine_cores()} cores; runs "
                    "wait for them (`dstui run --overlap` starts them beside, timings marked overlapped)"]  # fmt: skip

    core_share.allow_overlap(batch)
    LocalBackend({"parallel": 0, "cores": core_share.OVERLAP}).start_queued(batch, [mine], [], lambda rd, slot: started.append(rd))
    assert started == [mine]
    assert LocalBackend().launch_notes(batch)[0].startswith("cores shared: batch smoke-1 (run z0-r0)")
    assert sorted(h.run for h in gpu_ledger.read()[0]) == ["a-r0", "z0-r0"]  # both claim the cores now
    merge_status(other, dict(state="done", ended=time.time()))  # ended: it holds nothing any more, and is a recent run
    live, ended = gpu_ledger.read()
    assert [h.run for h in live] == ["a-r0"] and [e.run for e in ended] == ["z0-r0"]
    with gpu_ledger.opened():  # a writer moves it to recent.json
        pass
    assert [e.run for e in gpu_ledger.read()[1]] == ["z0-r0"]
    assert "z0-r0" in (tmp_path / "ledger" / "recent.json").read_text()


def test_an_end_seen_before_the_last_lines_were_read_is_settled_again_at_the_last_step(tmp_path: Path) -> None:
    """The supervisor can see a job's end (and settle its overlap) before it has read the job's last lines.

    Seen in a suite run: a 300-step run ended `done` with its timeline stopping at the steps read
    when the end was seen; the draining that follows counted the rest. The backend's look after the
    drain (follow.RunFollower._finalize_run) settles it again at the last step; a settled look at the
    last step is not redone.
    """
    from dstui.execute.backends.local import LocalBackend

    rd = _run(tmp_path, started=100.0, steps_done=280, steps_total=300)
    rd.update_status(**overlap.record(rd, rd.status(), [], [], 110.0, None, 2))
    merge_status(rd, {"state": "done", "ended": 111.0})
    backend = LocalBackend()
    backend._settle_overlap(rd)  # noqa: SLF001 - the end seen before the last lines were read
    assert rd.status()[overlap.TIMELINE][-1] == [110.0, 280] and rd.status()[overlap.OVERLAP]["final"]
    rd.update_status(steps_done=300)  # the drain read the rest
    backend._settle_overlap(rd)  # noqa: SLF001
    st = rd.status()
    assert st[overlap.TIMELINE][-1] == [111.0, 300] and overlap.at_last_step(st) and st[overlap.OVERLAP]["final"]
    before = st[overlap.TIMELINE]
    backend._settle_overlap(rd)  # noqa: SLF001 - settled at the last step: nothing to do
    assert rd.status()[overlap.TIMELINE] == before
