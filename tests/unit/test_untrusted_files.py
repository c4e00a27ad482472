"""A run's files are read as untrusted (issue 40, item 2): never through a link, regular files only, bounded.

Real files, links, FIFOs and devices in a temp folder; the readers under test are the ones the
supervisor, the artifact upload and every run-folder reader use. Each would have blocked
forever (FIFO) or read without end (/dev/zero) before. A property test draws folder contents
and checks that nothing raises, blocks or allocates more than a bound (tracemalloc).
"""

from __future__ import annotations

import json
import os
import stat
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dstui.core import run_files
from dstui.core.record_file import read_records
from dstui.core.records import Follower, MetricsWriter
from dstui.core.rundir import RunDir, read_json
from dstui.tracking import staging

pytestmark = pytest.mark.timeout(120)  # a reader that blocks on a FIFO fails here instead of hanging the suite


def record(step: int) -> str:
    return json.dumps({"type": "step", "step": step, "loss": 1.0 / step})


@pytest.fixture
def odd(tmp_path: Path) -> dict[str, Path]:
    """One of each thing a job can leave where a file is expected."""
    (tmp_path / "zero").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "fifo_link").symlink_to(tmp_path / "fifo")
    (tmp_path / "outside.txt").write_text(record(1) + "\n")
    (tmp_path / "outside_link").symlink_to(tmp_path / "outside.txt")
    (tmp_path / "folder").mkdir()
    return {name: tmp_path / name for name in ("zero", "fifo", "fifo_link", "outside_link", "folder")}


def test_every_reader_refuses_links_fifos_and_folders_by_name(odd: dict[str, Path]) -> None:
    for name, path in odd.items():
        with pytest.raises(run_files.NotRegular) as e:
            run_files.open_regular(path)
        assert str(e.value).startswith(f"{name} is a "), e.value
        assert read_json(path, "absent") == "absent"
        assert read_records(path) == []
        f = Follower(path)
        assert f.read_lines(final=True) == [] and f.refused.startswith(f"{name} is a ")
        assert staging.stage_file(path, path.parent / f"staged-{name}") == f.refused
        assert not (path.parent / f"staged-{name}").exists()
    assert "symbolic link (to /dev/zero)" in str(run_files.describe(odd["zero"]))


def test_log_tail_of_a_link_is_empty_and_bounded(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    rd.log_file.symlink_to("/dev/zero")
    assert rd.log_tail(4096) == ""
    rd.log_file.unlink()
    rd.log_file.write_bytes(b"a" * 100_000 + b"END")
    assert rd.log_tail(10) == "a" * 7 + "END"


def test_a_sparse_terabyte_is_stepped_over_not_read(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with open(path, "wb") as fh:
        fh.write((record(1) + "\n").encode())
        fh.truncate(1 << 40)
        fh.seek(1 << 40)
        fh.write(("\n" + record(2) + "\n").encode())
    f = Follower(path)
    lines = []
    for _ in range(10):  # each call reads at most its read size; the hole is skipped by SEEK_DATA
        lines += f.read_lines(final=True)
    assert [json.loads(line)["step"] for line, _ in lines] == [1, 2]
    assert f.bad_lines == 1 and "longer than" in f.first_bad  # the hole is one over-long line of zeros
    assert [r["step"] for r in read_records(path)] == [1, 2]


def test_open_append_never_writes_through_a_link_and_makes_0600(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "system.jsonl").symlink_to(victim)
    with pytest.raises(OSError):
        run_files.open_append(tmp_path / "system.jsonl")
    assert victim.read_text() == "keep"
    old = os.umask(0o022)
    try:
        w = MetricsWriter(tmp_path / "metrics.jsonl")
        w.write("step", step=1, loss=1.0)
        w.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "metrics.jsonl").stat().st_mode) == 0o600


def test_artifacts_are_bounded_head_and_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(staging, "ARTIFACT_MAX_BYTES", 1000)
    log = tmp_path / "stdout.log"
    log.write_text("HEAD" + "x" * 5000 + "TAIL https://user:secret@host/x\n")
    assert staging.stage_file(log, tmp_path / "staged.log") is None
    staged = (tmp_path / "staged.log").read_text()
    assert staged.startswith("HEAD") and "TAIL" in staged and "secret" not in staged
    assert "dstui left out" in staged and len(staged) < 1200
    blob = tmp_path / "blob.bin"
    blob.write_bytes(os.urandom(2000))
    assert "over the" in (staging.stage_file(blob, tmp_path / "staged.bin") or "")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"settings": {"env": {"HF_TOKEN": "hf_abcdefghijklmnop"}}}))
    assert staging.stage_file(spec, tmp_path / "staged.json") is None
    assert "hf_abcdefghijklmnop" not in (tmp_path / "staged.json").read_text()


def test_the_upload_lists_what_it_left_out(odd: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(record(1) + "\n")
    staged = tmp_path / "staged"
    staged.mkdir()
    problems = staging.stage_folder(tmp_path, staged)
    assert sorted(p.split(" ", 1)[0] for p in problems) == ["fifo", "fifo_link", "outside_link", "zero"]
    assert (staged / "metrics.jsonl").exists() and not (staged / "folder").exists()


KINDS = ("zero_link", "fifo", "fifo_link", "outside_link", "folder", "sparse", "binary", "cr_lines", "records")


def make(path: Path, kind: str, data: bytes, size: int) -> None:
    if kind == "zero_link":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "fifo_link":
        os.mkfifo(path.with_suffix(".fifo"))
        path.symlink_to(path.with_suffix(".fifo"))
    elif kind == "outside_link":
        path.symlink_to("/etc/hostname")
    elif kind == "folder":
        path.mkdir()
    elif kind == "sparse":
        with open(path, "wb") as fh:
            fh.write(data)
            fh.truncate(size)
    elif kind == "binary":
        path.write_bytes(data)
    elif kind == "cr_lines":
        path.write_bytes(b"\r".join(record(s).encode() for s in range(1, 6)) + b"\r" + data)
    else:
        path.write_bytes(b"".join((record(s) + "\n").encode() for s in range(1, 6)) + data)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(KINDS), data=st.binary(max_size=4096), size=st.sampled_from([0, 1 << 20, 1 << 36, 1 << 40]))
def test_any_file_is_read_within_bounds(tmp_path_factory: pytest.TempPathFactory, kind: str, data: bytes, size: int) -> None:
    folder = tmp_path_factory.mktemp("f")
    path = folder / "metrics.jsonl"
    make(path, kind, data, size)
    tracemalloc.start()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(staging, "ARTIFACT_MAX_BYTES", 1 << 20)  # the upload's bound, small here
            f = Follower(path, max_line=1 << 20)
            for _ in range(50):
                if not f.read_lines(final=True) and not f.skipping:
                    break
            read_records(path)
            read_json(path)
            RunDir(folder).log_tail()
            staging.stage_file(path, folder / "staged")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # the bound: a follower's read size and an artifact's head and tail (1 MiB each here, a few copies while
    # decoding and cleaning), never the file's size (up to a TiB here)
    assert peak < 16 << 20, (kind, size, peak)
