"""CPU cores as one resource across batches (issue 38.2): who waits, what ran beside a run, what reports keep."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from dstui.core.rundir import RunDir
from dstui.execute import core_share, gpu_ledger, overlap
from dstui.execute.gpu_ledger import Holder


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
    rd.update_status(state="running", **status)
    return rd


def test_a_look_records_every_other_run_and_the_steps_it_overlapped(tmp_path: Path) -> None:
    rd = _run(tmp_path, steps_done=1, steps_total=10)
    beside = _holder("lrsweep-2", "z1-r0", 2)
    mine = Holder(str(rd.path), "b-1", "a-r0", (), None, 2)
    seen = overlap.record(rd, rd.status(), [mine, beside], 100.0, 3.0, 2)
    rd.update_status(**seen, steps_done=6)
    seen = overlap.record(rd, rd.status(), [mine, beside], 105.0, 5.0, 2)
    entry = seen[overlap.BESIDE][beside.run_path]
    assert entry == {"batch": "lrsweep-2", "run": "z1-r0", "from": 100.0, "to": 105.0, "open": True, "steps": [1, 6]}
    assert str(rd.path) not in seen[overlap.BESIDE]  # never beside itself
    assert seen[overlap.HOST_LOAD] == {"mean": 4.0, "max": 5.0, "samples": 2, "cores": 2}
    summary = seen[overlap.OVERLAP]
    # seen at steps_done 1 and 6: steps 1 (it may have begun just before the look) to 7 (running at the last)
    assert summary["timed"] is True and summary["steps"] == [1, 7]
    assert summary["text"] == "steps 1-7 beside batch lrsweep-2 (run z1-r0); host load 4.0 mean, 5.0 max on 2 cores"
    tags = overlap.tags({overlap.OVERLAP: summary})
    assert tags == {"dstui.overlapped": "true", "dstui.overlap": summary["text"]}
    # the run ends with the other still beside it at its last look: to its last step
    ended = {**rd.status(), **seen, "state": "done"}
    assert overlap.tags(ended)["dstui.overlap"].startswith("steps 1-10 beside batch lrsweep-2")
    # a look that no longer sees the other closes the entry at this run's steps then
    rd.update_status(**seen, steps_done=8)
    closed = overlap.record(rd, rd.status(), [mine], 110.0, None, 2)
    assert closed[overlap.BESIDE][beside.run_path]["steps"] == [1, 8]
    assert closed[overlap.BESIDE][beside.run_path]["open"] is False
    assert overlap.tags({**rd.status(), **closed, "state": "done"})["dstui.overlap"].startswith("steps 1-9 beside")


def test_an_overlap_within_warm_up_leaves_the_timings_its_own(tmp_path: Path) -> None:
    """Another run during start-up and the first step only: the timed steps (after warm-up 2) ran alone."""
    s = overlap.summarize({"/x": {"batch": "b", "run": "r", "open": False, "steps": [0, 0]}}, {}, warmup=2, total=10)
    assert (s.timed, s.steps) == (False, (1, 1))
    alone = overlap.summarize({}, {"mean": 1.0, "max": 1.5, "samples": 3, "cores": 2}, warmup=2, total=10)
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
    other.update_status(state="running", pgid=os.getpgid(0))  # a live group: this test's own
    with gpu_ledger.opened() as ledger:
        ledger.add(other, [], core_share.machine_cores())
    mine = RunDir(tmp_path / "runs" / "lrsweep-2" / "a-r0")
    mine.path.mkdir(parents=True)
    (mine.path / "spec.json").write_text('{"settings": {"gpus": 2}}')
    mine.update_status(state="queued")
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
    assert sorted(h.run for h in gpu_ledger.read()) == ["a-r0", "z0-r0"]  # both claim the cores now
    other.update_status(state="done", ended=time.time())  # ended: it holds nothing any more
    assert [h.run for h in gpu_ledger.read()] == ["a-r0"]
