"""What a resolved revision is: the interpreter to run, its identity, and checks on it.

Kept apart from planning and building so the supervisor and launcher (which only
read a resolved revision from a run folder) import nothing of the build machinery.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dstui.core.errors import DstuiError

Progress = Callable[[str], None]

#: Bumped when the layout of a cached env changes, so old entries are not reused.
ENV_FORMAT = 1
MARKER = "dstui-env.json"
PTH_NAME = "_dstui_base_env.pth"
DIFF_NAME = "source.diff"
LOG_TAIL_LINES = 40


class RevisionBuildError(DstuiError):
    """Building a revision's environment failed; the message has the log tail."""


@dataclass(frozen=True)
class ResolvedRevision:
    """A revision ready to run: the interpreter to start the deepspeed launcher with."""

    name: str
    kind: str  # "pypi" | "git" | "path" | "installed"
    python: str
    requested: str
    version: str
    sha: str | None = None
    env_dir: str | None = None
    diff_path: str | None = None
    install: str | None = None  # "source" (commit's source on the path) | "pip" (pip-built); None: installed

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for batch.json / spec.json (round-trips through :meth:`from_dict`)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ResolvedRevision:
        return cls(**{k: data.get(k) for k in cls.__dataclass_fields__})

    def mlflow_tags(self) -> dict[str, str]:
        """Tags that say exactly which DeepSpeed a run was asked to use."""
        tags = {
            "dstui.revision": self.name,
            "dstui.revision.kind": self.kind,
            "dstui.revision.requested": self.requested,
            "dstui.revision.version": self.version,
        }
        if self.sha:
            tags["dstui.revision.sha"] = self.sha
        if self.install:
            tags["dstui.revision.install"] = self.install
        return tags


def python_for(resolved: ResolvedRevision) -> str:
    """Interpreter to start ``python -m deepspeed.launcher.runner`` with for this revision.

    Checked here rather than trusted, because a cache folder may have been
    cleaned between resolving and launching (a run would then fail obscurely).
    """
    if not Path(resolved.python).exists():
        raise DstuiError(
            f"revision '{resolved.name}': interpreter {resolved.python} is gone "
            "(cache cleaned?); resolve the revision again"
        )
    return resolved.python


def run_env(resolved: ResolvedRevision) -> dict[str, str]:
    """Extra environment variables for a run under this revision.

    DeepSpeed JIT-builds ops (e.g. the CPU shm comm op) into
    ``~/.cache/torch_extensions/<op>`` whatever its version. Two revisions
    with different op sources, run A B A B, would then rebuild each other's
    op before every run (and could load a stale one); a per-env folder keeps
    each revision's compiled ops apart and cached. ``installed`` keeps the
    user's usual folder.
    """
    if not resolved.env_dir:
        return {}
    return {"TORCH_EXTENSIONS_DIR": str(Path(resolved.env_dir) / "torch_extensions")}


def check_reported_version(resolved: ResolvedRevision, header_versions: dict[str, Any]) -> str | None:
    """Compare what a running process imported with what the revision resolved to.

    ``header_versions`` is the ``versions`` dict of a metrics header, or the
    whole header (then ``deepspeed_git_sha`` is checked too). Returns a
    message for a mismatch (the run must fail loudly: a comparison of two
    revisions that secretly ran the same DeepSpeed is worse than no result),
    or None when the run used what it claims.
    """
    versions = header_versions.get("versions", header_versions)
    if not isinstance(versions, dict):
        versions = {}
    reported = versions.get("deepspeed")
    if not reported:
        return f"revision '{resolved.name}': the run did not report its DeepSpeed version"
    if str(reported) != resolved.version:
        return (
            f"revision '{resolved.name}' resolved to DeepSpeed {resolved.version} "
            f"({resolved.python}) but the run imported DeepSpeed {reported}: "
            "is PYTHONPATH or the working directory shadowing the revision's deepspeed?"
        )
    sha = header_versions.get("deepspeed_git_sha")
    if resolved.sha and sha and sha != "unknown":
        short, full = sorted((str(sha), resolved.sha), key=len)
        if not full.startswith(short):
            return (
                f"revision '{resolved.name}' resolved to commit {resolved.sha[:12]} "
                f"but the run reports DeepSpeed git sha {sha}"
            )
    return None

