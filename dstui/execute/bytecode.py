"""A bytecode cache for processes dstui starts, where the environment forbids the usual one.

Container images often set ``PYTHONDONTWRITEBYTECODE=1`` and install packages
without compiled bytecode (``pip install --no-compile``). Then every Python
process compiles torch, transformers and DeepSpeed from source on import: on
the lent H100 image (no ``__pycache__`` under torch at all) that is 15-20 s
per rank, per supervisor, per op check, paid again by every run of a batch
(docs/gpu-validation/README.md, section 6b).

dstui does not touch the install for this: where bytecode cannot be kept, the
processes it starts get ``PYTHONPYCACHEPREFIX`` pointing into dstui's cache
(a tree of ``.pyc`` files mirroring the source paths, keyed by the
interpreter's version tag), so the first run compiles and every later one
loads. A user's own ``PYTHONPYCACHEPREFIX`` wins; ``DSTUI_BYTECODE_CACHE=0``
turns this off.

The ``dstui`` command itself starts again once with the cache
(:func:`reexec_with_cache`) when it finds itself in such an environment: its
own imports (mlflow, pandas, textual) are the same story.

No third-party imports (stdlib and dstui.core.paths): the run wrapper's supervisor start and
the CLI's first line use it.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
from pathlib import Path

from dstui.core import paths

OFF_SWITCH = "DSTUI_BYTECODE_CACHE"


def default_root() -> Path:
    """``<dstui cache>/bytecode``."""
    return paths.cache_dir() / "bytecode"


def torch_has_bytecode(env_dir: str | None = None) -> bool | None:
    """Whether torch's package folder holds compiled bytecode (None: torch not found).

    ``env_dir``: a revision's virtual environment, looked at first; otherwise
    (or if torch is not in it) the torch this interpreter would import. Found
    without importing torch.
    """
    folders = (
        glob.glob(os.path.join(env_dir, "lib", "python*", "site-packages", "torch"))
        if env_dir
        else []
    )
    if not folders:
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.origin:
            return None
        folders = [os.path.dirname(spec.origin)]
    return any(
        glob.glob(os.path.join(folder, "__pycache__", "__init__.*.pyc")) for folder in folders
    )


def needs_cache(env: dict[str, str], *, env_dir: str | None = None) -> bool:
    """True when a process started with ``env`` would compile its imports from source every time."""
    if env.get(OFF_SWITCH) == "0" or env.get("PYTHONPYCACHEPREFIX"):
        return False
    if env.get("PYTHONDONTWRITEBYTECODE"):
        # Python reads bytecode it cannot write: fine as long as the install shipped it
        return torch_has_bytecode(env_dir) is False
    return False


def apply(
    env: dict[str, str], *, env_dir: str | None = None, root: Path | None = None
) -> dict[str, str]:
    """``env`` with the bytecode cache switched on where :func:`needs_cache` says so (a new dict)."""
    out = dict(env)
    if needs_cache(env, env_dir=env_dir):
        out.pop("PYTHONDONTWRITEBYTECODE", None)
        out["PYTHONPYCACHEPREFIX"] = str(root or default_root())
    return out


def reexec_with_cache() -> None:
    """Replace this process by the same command line with the cache on, where :func:`needs_cache` says so.

    Costs nothing where bytecode works (no ``PYTHONDONTWRITEBYTECODE``: not
    even a look for torch). The new process has the prefix set, so it never
    starts itself again. If the exec fails, this process simply goes on.
    """
    env = dict(os.environ)
    cached = apply(env)
    if cached == env:
        return
    try:
        os.execve(sys.executable, list(sys.orig_argv), cached)
    except OSError:
        return
