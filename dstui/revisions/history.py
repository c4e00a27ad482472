"""The commits between two refs of a local clone, read-only (for ``dstui bisect``).

Only the first-parent line is listed, as ``git bisect --first-parent`` does:
on a project that merges pull requests, each of those commits is a state of the
main branch that once existed and built, while commits inside a merged branch
may never have been meant to run on their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dstui.core.errors import SpecError
from dstui.revisions.plan import run_git


@dataclass(frozen=True)
class Commit:
    """One commit of the line: full sha and subject line."""

    sha: str
    subject: str

    @property
    def short(self) -> str:
        return self.sha[:12]


def resolve_ref(repo: Path, ref: str, *, field: str) -> str:
    """Full sha of ``ref``; a one-line error naming the option when it is unknown."""
    out = run_git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}", check=False)
    if out.returncode != 0 or not out.stdout.strip():
        raise SpecError(f"unknown git ref '{ref}' in {repo}", field=field)
    return out.stdout.strip()


def first_parent_line(repo: str | Path, good: str, bad: str) -> tuple[Commit, list[Commit]]:
    """The good commit and the first-parent commits after it up to and including bad, oldest first."""
    path = Path(repo).expanduser().resolve()
    if not path.is_dir() or run_git(path, "rev-parse", "--git-dir", check=False).returncode != 0:
        raise SpecError(f"{path} is not a git repository", field="--repo")
    good_sha = resolve_ref(path, good, field="--good")
    bad_sha = resolve_ref(path, bad, field="--bad")
    if good_sha == bad_sha:
        raise SpecError(f"--good and --bad are the same commit ({good_sha[:12]})", field="--bad")
    if run_git(path, "merge-base", "--is-ancestor", good_sha, bad_sha, check=False).returncode != 0:
        raise SpecError(f"--good {good} ({good_sha[:12]}) is not an ancestor of --bad {bad}", field="--good")
    log = run_git(path, "log", "--first-parent", "--reverse", "--format=%H%x00%s", f"{good_sha}..{bad_sha}").stdout
    line = [Commit(*row.split("\0", 1)) for row in log.splitlines() if row]
    parent = run_git(path, "rev-parse", f"{line[0].sha}^1", check=False).stdout.strip() if line else ""
    if not line or line[-1].sha != bad_sha or parent != good_sha:
        raise SpecError(
            f"--good {good} is not on the first-parent line of --bad {bad} (inside a merged branch?)", field="--good"
        )
    subject = run_git(path, "log", "-1", "--format=%s", good_sha).stdout.strip()
    return Commit(good_sha, subject), line
