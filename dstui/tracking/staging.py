"""A run folder's files copied for upload as MLflow artifacts, read as what they are: the run's.

The job can put anything in its folder. The upload used to check a file's size
through a link (0 for ``/dev/zero``) and then read it whole: the supervisor grew
until the kernel killed it, on every takeover again, and the batch never ended.
Here a file is staged only when it is a regular file of its own (never through
a link, never a FIFO or device: :mod:`dstui.core.run_files`), and at most
:data:`ARTIFACT_MAX_BYTES` of it: a longer text keeps its head and its tail (where
a failure is) around a line saying how much was left out; a longer binary file is
not uploaded. What was not staged comes back as a named problem of that run.
JSON goes through :func:`secrets.redact`, text loses URI credentials and tokens.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dstui.core import run_files
from dstui.core.rundir import PRIVATE_FILES

#: the most of one file that is uploaded (head and tail of a longer text)
ARTIFACT_MAX_BYTES = 32 << 20
TEXT_SUFFIXES = (".log", ".txt", ".jsonl", ".yaml")
JSON_MAX_BYTES = 32 << 20


def stage_folder(folder: Path, staged: Path) -> list[str]:
    """Stage the folder's own files (not its sub-folders, hidden or private files); the problems met."""
    problems: list[str] = []
    with os.scandir(folder) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.name.startswith(".") or entry.name in PRIVATE_FILES or entry.is_dir(follow_symlinks=False):
                continue
            problem = stage_file(Path(entry.path), staged / entry.name)
            if problem:
                problems.append(problem)
    return problems


def stage_file(src: Path, dst: Path) -> str | None:
    """Copy one file for upload, bounded and cleaned; the problem (in words) when it is not staged."""
    try:
        fd = run_files.open_regular(src)
    except FileNotFoundError:
        return None
    except run_files.NotRegular as e:
        return str(e)
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if src.suffix == ".json" and size <= JSON_MAX_BYTES:
            from dstui.core.secrets import redact

            raw = fh.read(JSON_MAX_BYTES)
            try:
                dst.write_text(json.dumps(redact(json.loads(raw)), indent=2, default=str))
                return None
            except (ValueError, RecursionError):
                fh.seek(0)
        text = src.suffix in (TEXT_SUFFIXES + (".json",))
        if size > ARTIFACT_MAX_BYTES and not text:
            return f"{src.name} is {size} bytes, over the {ARTIFACT_MAX_BYTES >> 20} MiB artifact limit: not uploaded"
        data = _bounded(fh, size)
    if text:
        from dstui.core.credential_text import strip_credentials

        dst.write_text(strip_credentials(data.decode("utf-8", "replace")))
    else:
        dst.write_bytes(data)
    return None


def _bounded(fh, size: int) -> bytes:  # noqa: ANN001 - a binary file object
    """The whole file when it fits, else its head and tail around a line saying what was left out."""
    if size <= ARTIFACT_MAX_BYTES:
        return fh.read(ARTIFACT_MAX_BYTES)
    half = ARTIFACT_MAX_BYTES // 2
    head = fh.read(half)
    fh.seek(size - half)
    tail = fh.read(half)
    left_out = size - len(head) - len(tail)
    return head + f"\n[... dstui left out {left_out} bytes of this file here ...]\n".encode() + tail
