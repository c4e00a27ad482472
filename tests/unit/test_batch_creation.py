"""Issue 33.2 and 33.4 in one process: settling a cut-short batch, finding any batch, the wrapper's reserved exit record.

The kill -9 and tmpfs versions with real processes are in tests/e2e/test_batch_integrity.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from dstui.core.errors import DstuiError
from dstui.core.rundir import BatchDir, RunDir, list_batches, merge_status, write_json_atomic
from dstui.execute import batch, creation, launch
from dstui.execute.batch_lock import BatchLock
from dstui.execute.injob import wrap


@pytest.fixture
def spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DSTUI_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DSTUI_PRIVATE_DIR", str(tmp_path / "private"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    data = {"name": "u", "repeats": 4, "settings": {"kind": "command", "steps": 1, "warmup_steps": 0},
            "conditions": [{"name": "c", "command": [sys.executable, "-c", "pass"]}]}  # fmt: skip
    p = tmp_path / "u.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def cut_short(root: Path) -> BatchDir:
    """A batch as a killed `dstui run` leaves it: c-r0 whole, c-r1 half-written (no status.json), c-r2 and c-r3 never made."""
    b = BatchDir(root / "u-20260101-000000")
    b.path.mkdir(parents=True)
    write_json_atomic(b.batch_file, {"id": b.id, "experiment": "u", "spec_path": "/specs/u.yaml",
                                     "runs": ["c-r0", "c-r1", "c-r2", "c-r3"], creation.COMPLETE: False})  # fmt: skip
    merge_status(RunDir(b.path / "c-r0"), dict(name="c-r0", state="queued", key="k0"))
    (b.path / "c-r1").mkdir()
    (b.path / "c-r1" / "spec.json").write_text("{}")
    return b


def test_a_cut_short_batch_is_settled_once_and_every_run_is_listed(tmp_path: Path) -> None:
    b = cut_short(tmp_path / "runs")
    assert [rd.name for rd in b.runs()] == ["c-r0", "c-r1"]  # before: two runs silently missing
    note = creation.settle(b)
    assert note is not None and "3 of 4 runs were never laid out" in note and f"--resume {b.id}" in note
    assert [rd.name for rd in b.runs()] == ["c-r0", "c-r1", "c-r2", "c-r3"]
    assert [rd.state for rd in b.runs()] == ["queued", "failed", "failed", "failed"]
    assert {rd.status()["reason"] for rd in b.runs()[1:]} == {creation.NEVER_CREATED}
    assert creation.is_complete(b) and b.info()[creation.PROBLEM] == note
    assert creation.settle(b) is None  # done once
    with pytest.raises(DstuiError, match="never created.*--resume"):
        batch.retry(RunDir(b.path / "c-r2"))  # retry cannot make it; --resume BATCH can


def test_a_batch_whose_lock_is_held_is_left_to_its_holder(tmp_path: Path) -> None:
    b = cut_short(tmp_path / "runs")
    lock = BatchLock(b)
    lock.acquire()  # being laid out right now (or its supervisor is on it)
    try:
        assert creation.settle(b) is None
        assert creation.settle_all(tmp_path / "runs") == []
        assert not creation.is_complete(b) and len(b.runs()) == 2
    finally:
        lock.release()
    assert creation.settle_all(tmp_path / "runs") != []
    assert creation.is_complete(b)


def test_create_is_whole_or_removed_and_hidden_while_laid_out(spec: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "runs"
    p = batch.plan(spec, validate=False, progress=lambda _: None)
    b = batch.create(p, runs_root=root)
    assert creation.is_complete(b) and b.info()[creation.COMPLETE] is True
    assert [rd.state for rd in b.runs()] == ["queued"] * 4
    assert list_batches(root) == [b] and creation.find_batch(b.id, root) == b
    assert creation.find_batch(str(b.path), root) == b and creation.find_batch("nope", root) is None

    real = launch.prepare
    seen: list[list[tuple[str, bool]]] = []

    def fail_on_third(batch_path: Path, run, *a, **kw):  # noqa: ANN001, ANN002, ANN003
        if run.name == "c-r2":
            seen.append([(x.id, creation.is_complete(x)) for x in list_batches(root)])  # mid-way: listed, not complete
            raise OSError(28, "No space left on device")
        return real(batch_path, run, *a, **kw)

    monkeypatch.setattr(launch, "prepare", fail_on_third)
    with pytest.raises(OSError):
        batch.create(p, runs_root=root)
    assert sorted(done for _, done in seen[0]) == [False, True]
    assert list_batches(root) == [b]  # the failed one is gone, whole
    assert sorted(e.name for e in root.iterdir()) == [b.id]  # and no hidden folder is left


def test_hidden_folders_are_not_batches_and_stale_ones_go(tmp_path: Path) -> None:
    import os
    import time

    root = tmp_path / "runs"
    hidden = BatchDir(root / f"{creation.TEMP_PREFIX}x")
    hidden.path.mkdir(parents=True)
    write_json_atomic(hidden.batch_file, {"id": "u-1", "experiment": "u", "runs": []})
    assert list_batches(root) == [] and creation.find_batch(hidden.path.name, root) is None
    assert creation.remove_stale_temp(root) == 0  # young: its creator may still be at it
    old = time.time() - creation.STALE_TEMP_S - 1
    os.utime(hidden.path, (old, old))
    assert creation.remove_stale_temp(root) == 1 and not hidden.path.exists()


def test_the_wrapper_records_the_exit_in_its_reserved_room(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    code = wrap.main([str(run_dir), "--", sys.executable, "-c", "import sys; sys.exit(3)"])
    assert code == 3
    rec = json.loads((run_dir / "exit.json").read_text())
    assert rec["exit_code"] == 3 and rec["signal"] is None and "disk_full" not in rec  # room enough here
    assert sorted(p.name for p in run_dir.iterdir()) == ["exit.json"]  # the reservation became it
    reserved = wrap.reserve(str(run_dir))
    assert reserved is not None and Path(reserved).stat().st_size == wrap.RESERVED_BYTES
    assert wrap.record(str(run_dir), {"exit_code": 0, "disk_full": True}, reserved)
    assert json.loads((run_dir / "exit.json").read_text()) == {"exit_code": 0, "disk_full": True}
    assert not Path(reserved).exists()


def test_a_full_disk_at_the_end_is_the_reason() -> None:
    from dstui.execute.liveness import outcome, wrapper_exit

    fields = outcome({"steps_done": 2}, {"exit_code": 1, "disk_full": True}, {}, cancelled=False, log_tail=lambda: "xxxx")
    assert (fields["state"], fields["reason"]) == ("failed", "disk full (No space left on device)")
    fields = outcome({"steps_done": 2}, {"exit_code": 1}, {}, cancelled=False, log_tail=lambda: "xxxx")
    assert fields["reason"] == "exit code 1"

    class Handle:
        returncode = -9

    assert wrapper_exit(Handle()) == {"exit_code": -9, "signal": 9, "from_wrapper": True}
    assert wrapper_exit(None) == {}
