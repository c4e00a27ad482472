"""One rule for every name that becomes a path component or an MLflow name.

Specs travel between people (shared repos, issues), so a name in one must never
decide where files land. Experiment, condition, revision and run names, batch
ids, import experiment names and report output names all pass
:func:`problem` (refuse) or :func:`make_safe` (repair, for names dstui derives
itself from axis values). Every join of such a name into a folder goes through
:func:`child_path`, which checks the resolved result stays inside that folder:
a second line of defence if a name slipped past the first.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from dstui.core.errors import DstuiError, SpecError

MAX_LEN = 100
ALLOWED = "letters A-Z a-z, digits, '.', '_', '+', '=', '-'"
_BAD_CHAR = re.compile(r"[^A-Za-z0-9._+=-]")


class UnsafePath(DstuiError):
    """A path built from a name would leave the folder it belongs in."""


def problem(name: object, max_len: int = MAX_LEN) -> str | None:
    """Why ``name`` cannot be a path component / MLflow name (one phrase naming it), or None."""
    why = _why(name, max_len)
    if why is None:
        return None
    if not isinstance(name, str):
        shown = repr(name)[:40]
    else:
        shown = repr(name) if len(name) <= 60 else f"{name[:40]!r}..."
    return f"name {shown} {why}"


def _why(name: object, max_len: int) -> str | None:
    if not isinstance(name, str):
        return f"must be a string, not {type(name).__name__}"
    if not name:
        return "must not be empty"
    if len(name) > max_len:
        return f"is {len(name)} characters long; at most {max_len}"
    if name in (".", ".."):
        return f"must not be {name!r}"
    bad = _BAD_CHAR.search(name)
    if bad:
        return f"has {_describe(bad.group())} at position {bad.start() + 1}; allowed: {ALLOWED}"
    if name[0] in "-.":
        return f"must not start with {name[0]!r}"
    return None


def _describe(ch: str) -> str:
    if ch in "/\\":
        return f"a path separator {ch!r}"
    if ch == "\0":
        return "a NUL byte"
    if ch.isspace():
        return "a space" if ch == " " else f"white space {ch!r}"
    return f"the character {ch!r}"


def check(name: object, *, file: str | None = None, condition: str | None = None, field: str | None = None) -> str:
    """``name`` itself if it obeys the rule; else a one-line :class:`SpecError` naming where it came from."""
    why = problem(name)
    if why:
        raise SpecError(why, file=file, condition=condition, field=field)
    return name  # type: ignore[return-value]


def make_safe(text: str) -> str:
    """A name obeying the rule made from any text (axis values): bad characters become '_'.

    Deterministic, so the same spec always gives the same run names; a long or
    rewritten name keeps a short hash of the original so two values never merge.
    """
    safe = _BAD_CHAR.sub("_", text).lstrip("-.") or "_"
    if safe != text or len(safe) > MAX_LEN:
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        safe = f"{safe[: MAX_LEN - 9]}-{digest}"
    return safe


RUN_NAME_MAX = 2 * MAX_LEN + 20  # condition, revision and repeat joined


def is_safe(name: object, max_len: int = MAX_LEN) -> bool:
    return problem(name, max_len) is None


def child_path(parent: Path, name: str) -> Path:
    """``parent / name``, refusing any result that is not a direct child of ``parent`` once resolved."""
    why = problem(name, max_len=255)
    if why:
        raise UnsafePath(f"refusing a folder under {parent}: {why}")
    base = Path(parent).resolve()
    path = (base / name).resolve()
    if path.parent != base:
        raise UnsafePath(f"refusing {name!r}: {path} is not inside {base}")
    return base / name


def inside(parent: Path, path: Path) -> bool:
    """True when ``path`` resolves to somewhere under ``parent`` (for checks before deleting)."""
    base = Path(parent).resolve()
    target = Path(path).resolve()
    return target != base and base in target.parents
