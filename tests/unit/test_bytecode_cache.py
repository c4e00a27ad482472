"""Processes dstui starts keep compiled bytecode in dstui's cache where the environment forbids it (issue 12).

The decision (no bytecode shipped + PYTHONDONTWRITEBYTECODE), its wiring into a
run's environment, and a real interpreter started with that environment: the
first import writes a .pyc under the cache, the next one loads it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dstui.execute import bytecode, launch
from dstui.spec.expand import expand
from dstui.spec.loading import parse_spec


def _venv(tmp_path: Path, *, with_pyc: bool) -> Path:
    """A revision environment's layout with a torch package, bytecode or not."""
    torch_dir = tmp_path / "env" / "lib" / "python3.12" / "site-packages" / "torch"
    torch_dir.mkdir(parents=True)
    (torch_dir / "__init__.py").write_text("")
    if with_pyc:
        (torch_dir / "__pycache__").mkdir()
        (torch_dir / "__pycache__" / "__init__.cpython-312.pyc").write_bytes(b"")
    return tmp_path / "env"


def test_the_cache_is_switched_on_only_where_imports_would_compile_every_time(tmp_path: Path) -> None:
    bare = str(_venv(tmp_path / "a", with_pyc=False))
    shipped = str(_venv(tmp_path / "b", with_pyc=True))
    no_write = {"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin"}
    root = tmp_path / "cache"

    env = bytecode.apply(no_write, env_dir=bare, root=root)
    assert env["PYTHONPYCACHEPREFIX"] == str(root) and "PYTHONDONTWRITEBYTECODE" not in env
    assert env["PATH"] == "/usr/bin" and no_write["PYTHONDONTWRITEBYTECODE"] == "1"  # a copy

    assert bytecode.apply(no_write, env_dir=shipped, root=root) == no_write  # bytecode shipped: read it
    assert bytecode.apply({"PATH": "/usr/bin"}, env_dir=bare, root=root) == {"PATH": "/usr/bin"}  # Python writes its own
    own = {**no_write, "PYTHONPYCACHEPREFIX": "/mine"}
    assert bytecode.apply(own, env_dir=bare, root=root) == own  # the user's prefix wins
    off = {**no_write, bytecode.OFF_SWITCH: "0"}
    assert bytecode.apply(off, env_dir=bare, root=root) == off


def test_a_runs_environment_gets_the_cache_of_its_revision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSTUI_CACHE", str(tmp_path / "dstui-cache"))
    (run,) = expand(parse_spec({"name": "b", "settings": {"kind": "command", "command": ["prog"]}}))
    rd = launch.prepare(tmp_path / "runs" / "b-1", run, {})
    rev = {"env_dir": str(_venv(tmp_path, with_pyc=False))}

    env = launch.build_env(run, rd, base={"PYTHONDONTWRITEBYTECODE": "1"}, revision=rev)
    assert env["PYTHONPYCACHEPREFIX"] == str((tmp_path / "dstui-cache" / "bytecode").resolve())
    assert "PYTHONDONTWRITEBYTECODE" not in env
    assert "PYTHONPYCACHEPREFIX" not in launch.build_env(run, rd, base={}, revision=rev)


def test_an_interpreter_started_with_it_compiles_once_into_the_cache(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "heavy_module.py").write_text("VALUE = 42\n")
    root = tmp_path / "cache"
    no_write = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(src)}
    code = "import heavy_module, sys; print(heavy_module.__cached__)"

    def run(env: dict[str, str]) -> str:
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout

    run(no_write)
    assert not list(tmp_path.rglob("*.pyc"))  # the user's environment alone: compiled every time, kept nowhere
    with_cache = {**no_write, "PYTHONPYCACHEPREFIX": str(root)}
    with_cache.pop("PYTHONDONTWRITEBYTECODE")
    cached = Path(run(with_cache).strip())
    assert root in cached.parents and cached.is_file()
    assert not (src / "__pycache__").exists()  # the install is not touched
    stamp = cached.stat().st_mtime_ns
    run(with_cache)
    assert cached.stat().st_mtime_ns == stamp  # loaded, not written again


def test_the_dstui_command_starts_itself_again_with_the_cache(tmp_path: Path) -> None:
    """Only where torch ships no bytecode and the environment forbids writing it: a fake torch without any."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("")
    repo = Path(__file__).resolve().parents[2]
    env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": f"{site}:{repo}", "DSTUI_CACHE": str(tmp_path / "c"),
           "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    code = "import os, sys; from dstui.execute import bytecode; bytecode.reexec_with_cache(); print(os.environ.get('PYTHONPYCACHEPREFIX'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == str((tmp_path / "c" / "bytecode").resolve())  # printed by the second process
    env["DSTUI_BYTECODE_CACHE"] = "0"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "None"
