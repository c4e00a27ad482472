"""Answers from the installed DeepSpeed, remembered on disk per install.

dstui asks DeepSpeed itself whether a config is valid and how much memory its
ZeRO stages keep per GPU. Asking means importing DeepSpeed, which pulls in torch
and much more: 5-6 s of every ``dstui list``, ``dstui run`` or TUI start, for
the same few questions each time. The answers depend only on the question and
on the install, so they are kept under dstui's cache, keyed by both.

The install is named without importing it: its version, where it lives, and
the modification time of its config module, so an upgrade, another env or an
edited source tree is a new key. Only answers are kept: a question whose
answer raised (a refused config) is asked again, so its message is always
DeepSpeed's own.

A question not answered before is asked with MLflow hidden from DeepSpeed's
import: its autotuner imports MLflow when it is installed (it is, for dstui), which
was half of the import (4.6 of 9.1 s in a cold `dstui list`); dstui never autotunes
in its own process, and MLflow imports as usual afterwards.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from dstui.core.paths import cache_dir
from dstui.core.rundir import write_json_atomic

T = TypeVar("T")

FOLDER = "deepspeed-answers"


def install_id() -> str | None:
    """The installed DeepSpeed, named without importing it; None when it cannot be told (not installed).

    A DeepSpeed blocked in this process (``sys.modules["deepspeed"] = None``) is
    not installed as far as its answers go, whatever was found before.
    """
    if "deepspeed" in sys.modules and sys.modules["deepspeed"] is None:
        return None
    return _found_install()


@functools.lru_cache(maxsize=1)
def _found_install() -> str | None:
    import importlib.metadata
    import importlib.util

    try:
        found = importlib.util.find_spec("deepspeed")
        if found is None or not found.origin:
            return None
        module = Path(found.origin).parent / "runtime" / "config.py"
        return f"{importlib.metadata.version('deepspeed')}|{module}|{module.stat().st_mtime_ns}"
    except (ImportError, OSError, ValueError):
        return None


@contextlib.contextmanager
def _mlflow_hidden() -> Any:
    """``import mlflow`` fails while DeepSpeed imports (its autotuner takes that as no MLflow); unless
    this process has MLflow already."""
    if "mlflow" in sys.modules:
        yield
        return
    sys.modules["mlflow"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if sys.modules.get("mlflow", 0) is None:
            del sys.modules["mlflow"]


def _answer_file(kind: str, question: Any) -> Path | None:
    install = install_id()
    if install is None:
        return None
    blob = json.dumps({"kind": kind, "question": question, "install": install}, sort_keys=True, default=str)
    return cache_dir() / FOLDER / kind / hashlib.sha256(blob.encode()).hexdigest()


def remembered(kind: str, question: Any, ask: Callable[[], T]) -> T:
    """``ask()``'s JSON answer to ``question`` from the cache, or asked now and kept.

    ``question`` must hold everything the answer depends on besides the install.
    A cache that cannot be read or written only costs the next call its import.
    """
    path = _answer_file(kind, question)
    if path is not None:
        with contextlib.suppress(OSError, ValueError):
            return json.loads(path.read_text())["answer"]
    with _mlflow_hidden():
        answer = ask()
    if path is not None:
        with contextlib.suppress(OSError):  # whole or not at all: a concurrent reader never sees half
            write_json_atomic(path, {"answer": answer})
    return answer
