"""Real DeepSpeed source for tests and benchmarks: a release's sdist, unpacked as a clone of its tag looks.

No pytest here: benchmarks/source_env.py imports it too (with tests/ on its path).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path


def download(version: str, folder: Path) -> Path:
    """``deepspeed-VERSION.tar.gz`` in ``folder``, fetched by pip unless it is there already."""
    sdist = folder / f"deepspeed-{version}.tar.gz"
    if not sdist.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             f"deepspeed=={version}", "-d", str(folder), "-q"],
            capture_output=True, text=True,
        )  # fmt: skip
        if proc.returncode != 0 or not sdist.is_file():
            raise RuntimeError(f"pip download deepspeed=={version} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return sdist


def unpack_as_clone(sdist: Path, repo: Path) -> None:
    """Make ``repo``'s tree (``.git`` aside) the sdist's, without what a clone does not have.

    The sdist's top folder is dropped; egg-info, PKG-INFO and build.txt are
    written by ``setup.py sdist`` and are in no git tree.
    """
    repo.mkdir(parents=True, exist_ok=True)
    for p in repo.iterdir():
        if p.name != ".git":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    with tarfile.open(sdist) as tar:
        for m in tar.getmembers():
            m.name = m.name.split("/", 1)[1] if "/" in m.name else ""
        tar.extractall(repo, members=[m for m in tar.getmembers() if m.name], filter="data")
    shutil.rmtree(repo / "deepspeed.egg-info", ignore_errors=True)
    for name in ("PKG-INFO", "build.txt"):
        (repo / name).unlink(missing_ok=True)
