"""A bundled runner starts in its run folder, named through the slot's link (dstui/execute/cwd_link.py).

What the CUDA JIT cache keys on is glibc's ``get_current_dir_name()`` (measured
on the H100: benchmarks/gpu/diag_cwd.sh); these tests ask glibc itself, in real
child processes started by dstui's own launch path, what it names.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from dstui.core.rundir import RunDir
from dstui.execute import cwd_link, launch
from dstui.spec.expand import expand
from dstui.spec.experiment import RunSpec
from dstui.spec.loading import parse_spec

# What a rank sees: its environment's PWD, its physical folder, and what glibc calls its folder.
PROBE = f"""#!{sys.executable}
import ctypes, json, os
libc = ctypes.CDLL(None)
libc.get_current_dir_name.restype = ctypes.c_char_p
with open(os.environ["CWD_PROBE_OUT"], "w") as fh:
    json.dump({{"pwd": os.environ.get("PWD"), "cwd": os.getcwd(),
               "glibc": libc.get_current_dir_name().decode()}}, fh)
"""


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DSTUI_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DSTUI_PRIVATE_DIR", str(tmp_path / "private"))
    return tmp_path / "cache"


def _probe_python(tmp_path: Path) -> Path:
    exe = tmp_path / "fake-python"
    exe.write_text(PROBE)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def _train_run(tmp_path: Path, batch: str, kind: str = "train") -> tuple[RunSpec, RunDir]:
    settings = {"kind": kind, "steps": 3} | ({"command": ["prog"]} if kind == "command" else {})
    (run,) = expand(parse_spec({"name": "cwd", "settings": settings}))
    return run, launch.prepare(tmp_path / "runs" / batch, run, {})


def _start_and_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run: RunSpec, rd: RunDir, **kw: object
) -> dict[str, str]:
    out = tmp_path / f"probe-{rd.batch.path.name}.json"
    monkeypatch.setenv("CWD_PROBE_OUT", str(out))
    proc = launch.start(run, rd, python=str(_probe_python(tmp_path)), **kw)
    assert proc.wait(timeout=60) == 0, rd.log_file.read_text()
    return json.loads(out.read_text())


def test_runs_on_one_gpu_slice_share_a_folder_name_and_each_writes_into_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path
) -> None:
    seen = []
    for batch in ("b-1", "b-2"):
        run, rd = _train_run(tmp_path, batch)
        got = _start_and_read(tmp_path, monkeypatch, run, rd, gpu_slice=[1, 2])
        assert Path(got["cwd"]) == rd.path.resolve()  # relative outputs still land in the run folder
        seen.append(got["glibc"])
    link = str(cache.resolve() / "cwd" / "gpus-1-2")
    assert seen == [link, link]  # the same name for both runs: the JIT cache finds the first's kernels


def test_a_link_pointed_elsewhere_meanwhile_falls_back_to_the_real_folder(tmp_path: Path) -> None:
    first, second = tmp_path / "r1", tmp_path / "r2"
    first.mkdir()
    second.mkdir()
    env = {**os.environ, **cwd_link.env_for(first, [0]), "CWD_PROBE_OUT": str(tmp_path / "p.json")}
    cwd_link.point(second, [0])  # the slot's next run, before this one got to start
    import subprocess

    subprocess.run([str(_probe_python(tmp_path))], cwd=first, env=env, check=True)
    got = json.loads((tmp_path / "p.json").read_text())
    assert got["glibc"] == str(first.resolve())  # a cache miss, never another run's folder


def test_no_link_possible_leaves_the_run_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("DSTUI_CACHE", str(blocker))  # <cache>/cwd cannot be made
    run, rd = _train_run(tmp_path, "b-3")
    assert cwd_link.env_for(rd.path, None) == {}
    got = _start_and_read(tmp_path, monkeypatch, run, rd, gpu_slice=None)
    assert got["glibc"] == str(rd.path.resolve())


def test_command_runs_keep_the_folder_and_pwd_they_are_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path
) -> None:
    run, rd = _train_run(tmp_path, "b-4", kind="command")
    user_dir = tmp_path / "where-the-user-is"
    user_dir.mkdir()
    monkeypatch.setenv("PWD", str(user_dir))
    out = tmp_path / "cmd.json"
    monkeypatch.setenv("CWD_PROBE_OUT", str(out))
    run.settings.command = [str(_probe_python(tmp_path))]
    proc = launch.start(run, rd, cwd=str(user_dir), gpu_slice=[0])
    assert proc.wait(timeout=60) == 0, rd.log_file.read_text()
    got = json.loads(out.read_text())
    assert got["glibc"] == got["pwd"] == str(user_dir)
    assert not (cache / "cwd").exists()


@pytest.mark.parametrize(("gpus", "name"), [([0], "gpus-0"), ([3, 1], "gpus-3-1"), (None, "all"), ([], "all")])
def test_slot_names(gpus: list[int] | None, name: str) -> None:
    assert cwd_link.slot_name(gpus) == name
