"""Issue 40.6 as pure functions: a disk that cannot be written, said in one line (the e2e test mounts one)."""

from __future__ import annotations

import errno
import logging
import sqlite3
import warnings
from pathlib import Path

import pytest

from dstui.core import home_check, library_logs


def test_errors_met_part_way_are_named_by_what_the_disk_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSTUI_HOME", str(tmp_path))
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "runs" / "b" / "status.json"))
    assert home_check.problem_of(full).startswith(f"the runs home {tmp_path} is full (No space left on device)")
    try:
        try:
            raise sqlite3.OperationalError("attempt to write a readonly database")
        except sqlite3.OperationalError as inner:
            raise RuntimeError("(sqlite3.OperationalError) wrapped by SQLAlchemy") from inner
    except RuntimeError as wrapped:
        assert "is on a read-only file system" in home_check.problem_of(wrapped)
    elsewhere = OSError(errno.EROFS, "Read-only file system", "/srv/reports/report.md")
    assert home_check.problem_of(elsewhere) == "/srv/reports/report.md: Read-only file system"
    assert home_check.problem_of(OSError(errno.ENOENT, "No such file", "x")) is None
    assert home_check.problem_of(ValueError("bad")) is None


def test_a_writable_home_passes_and_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSTUI_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DSTUI_RUNS_DIR", raising=False)
    home_check.check_writable()  # not made yet: judged by its parent, nothing made
    assert not (tmp_path / "home").exists()
    (tmp_path / "home").mkdir()
    home_check.check_writable()
    assert list((tmp_path / "home").iterdir()) == []


def test_a_home_short_of_room_is_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSTUI_HOME", str(tmp_path))
    monkeypatch.setattr(home_check, "MIN_FREE_BYTES", 1 << 62)
    with pytest.raises(home_check.HomeNotWritable, match=rf"^the runs home {tmp_path} is full \(\d+ KiB free\)"):
        home_check.check_writable()


def test_library_log_on_a_home_that_cannot_be_written_costs_the_log_not_the_command(tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    blocker = tmp_path / "home"
    blocker.write_text("a file where the home's folder would be")  # its logs/ can never be made
    monkeypatch.setenv("DSTUI_HOME", str(blocker))
    library_logs.route()
    try:
        logging.getLogger("DeepSpeed").warning("a library line")  # raised from logging's handler before
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("a torch warning", UserWarning, stacklevel=1)
    finally:
        logging.captureWarnings(False)
