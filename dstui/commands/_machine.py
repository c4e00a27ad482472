"""`--json` / `--jsonl`: stdout carries only JSON; everything a command says to people goes to stderr.

The CLI enters :func:`machine_output` around a command run with either flag, so
the commands keep their ``print`` calls for people (they land on stderr) and
write documents with :func:`emit`. A script can then ``json.loads`` stdout
whatever the command printed along the way.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Any, TextIO

_out: TextIO | None = None  # the real stdout while a command runs in machine mode


def wants(args: Any) -> str | None:
    """'json', 'jsonl' or None: what the command's arguments ask for."""
    if getattr(args, "jsonl", False):
        return "jsonl"
    if getattr(args, "json", False):
        return "json"
    return None


@contextlib.contextmanager
def machine_output(enabled: bool) -> Iterator[None]:
    global _out
    if not enabled:
        yield
        return
    _out = sys.stdout
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _out = None


def emit(doc: Any, *, one_line: bool = False) -> None:
    """A JSON document (indented) or one JSON Lines record (``one_line``) on the real stdout."""
    out = _out or sys.stdout
    text = json.dumps(doc, default=str) if one_line else json.dumps(doc, indent=2, default=str)
    out.write(text + "\n")
    out.flush()


def active() -> bool:
    return _out is not None
