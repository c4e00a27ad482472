"""The release walk: ``--good 0.16.0 --bad 0.18.0`` bisects over the PyPI releases in between.

The release list comes from the package index pip is configured with (``pip
index versions deepspeed``, the call :mod:`dstui.revisions` already makes to
check PyPI versions), so a mirror or a local ``file://`` index works the same.
A release is tested like a commit: its cached PyPI env, an ordinary batch.

A release stands in the search where a commit would: :class:`Release` is a
:class:`~dstui.revisions.history.Commit` whose ``sha`` is the store key
``pypi-<version>``, so the per-condition store, the search and the report need
no second code path. With ``--repo`` the walk goes on over the first-parent
commits between the last good and the first bad release's tags (``v<version>``
or ``<version>``).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path

from dstui.core.errors import DstuiError, SpecError
from dstui.revisions.history import Commit, resolve_ref

PYPI_PREFIX = "pypi-"
_VERSION = re.compile(r"\d+(\.\d+)+([a-zA-Z0-9.+!-]*)")


def is_release(text: str) -> bool:
    """A bare version number such as 0.18.0 (a git ref like v0.18.0 or master is not)."""
    return bool(_VERSION.fullmatch(text.strip()))


@dataclass(frozen=True)
class Release(Commit):
    """A PyPI release as a point of the search: ``sha`` = ``pypi-<version>`` (the store's key)."""

    @classmethod
    def of(cls, version: str) -> Release:
        return cls(f"{PYPI_PREFIX}{version}", f"DeepSpeed {version} (PyPI)")

    @property
    def version(self) -> str:
        return self.sha.removeprefix(PYPI_PREFIX)

    @property
    def short(self) -> str:
        return self.version


def is_release_key(key: str) -> bool:
    return key.startswith(PYPI_PREFIX)


def available_releases() -> list[str]:
    """Every DeepSpeed version the configured package index lists (newest first, as pip prints them)."""
    from dstui.revisions.plan import BaseEnv, pypi_versions

    found = pypi_versions(BaseEnv.current())
    if not found:
        raise DstuiError("cannot list DeepSpeed releases: `pip index versions deepspeed` gave no answer "
                         "(offline? no index configured?); give --repo and git refs instead")  # fmt: skip
    return found


def release_line(good: str, bad: str, available: list[str]) -> tuple[Release, list[Release]]:
    """The good release and the releases after it up to and including bad, oldest first."""
    from packaging.version import InvalidVersion, Version

    def parse(v: str) -> Version | None:
        try:
            return Version(v)
        except InvalidVersion:
            return None

    known = {v: p for v in available if (p := parse(v)) is not None}
    ends = {}
    for name, text in (("--good", good), ("--bad", bad)):
        want = parse(text.strip())
        match = next((v for v, p in known.items() if want is not None and p == want), None)
        if match is None:
            near = ", ".join(sorted(known, key=known.__getitem__, reverse=True)[:8])
            raise SpecError(f"the package index lists no DeepSpeed release '{text}' (newest: {near})", field=name)
        ends[name] = match
    lo, hi = known[ends["--good"]], known[ends["--bad"]]
    if lo >= hi:
        raise SpecError(f"--good {good} must be an older release than --bad {bad}", field="--good")
    between = sorted((v for v, p in known.items() if lo < p <= hi), key=known.__getitem__)
    return Release.of(ends["--good"]), [Release.of(v) for v in between]


def release_tag(repo: Path, version: str) -> str:
    """The tag of a release in a DeepSpeed clone: ``v<version>`` (DeepSpeed's own) or ``<version>``."""
    for tag in (f"v{version}", version):
        with contextlib.suppress(SpecError):  # not this spelling of the tag: try the next
            resolve_ref(repo, f"refs/tags/{tag}", field="--repo")
            return tag
    raise SpecError(f"{repo} has no tag v{version} (or {version}) for release {version}: "
                    "`git fetch --tags` in the clone, or bisect commits with git refs", field="--repo")  # fmt: skip
