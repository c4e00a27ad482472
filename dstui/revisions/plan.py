"""Planning a revision: cheap validation (refs, trees, PyPI versions) and its cache key.

Nothing here builds: a typo in the third revision must fail in a second, before
the first two envs took a minute each. The base environment's fingerprint is
part of every key, so envs built for another interpreter are never reused.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import site
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dstui.core.errors import DstuiError, SpecError
from dstui.revisions.resolved import ENV_FORMAT
from dstui.spec.experiment import Revision

_GIT_TIMEOUT = 120
# pip settings that would send the install somewhere other than the new env.
_PIP_ENV_DROP = ("PIP_TARGET", "PIP_PREFIX", "PIP_ROOT", "PIP_USER", "PIP_EDITABLE", "PIP_REQUIREMENT")
# Folders that are build output, not source, when hashing or copying a plain tree.
_TREE_SKIP = {".git", "build", "dist", "__pycache__", ".eggs", ".pytest_cache", ".tox", ".venv"}


#: What decides what a pip build of a DeepSpeed commit installs besides the package's own files.
RECIPE_PATHS = (
    "setup.py", "setup.cfg", "pyproject.toml", "MANIFEST.in", "build.txt", "requirements", "op_builder", "accelerator",
)  # fmt: skip


# -- the base environment --------------------------------------------------------------


@dataclass(frozen=True)
class BaseEnv:
    """The environment dstui runs in: its interpreter and the site folders it sees."""

    python: str
    site_dirs: tuple[str, ...]
    fingerprint: str
    has_setuptools: bool = True

    @classmethod
    def current(cls) -> BaseEnv:
        wanted = set(site.getsitepackages())
        if site.ENABLE_USER_SITE and site.getusersitepackages():
            wanted.add(site.getusersitepackages())
        # sys.path order = the base's own precedence; keep it in the new env.
        dirs = tuple(p for p in sys.path if p in wanted and os.path.isdir(p))
        blob = json.dumps([ENV_FORMAT, sys.version, os.path.realpath(sys.executable), dirs])
        from importlib.util import find_spec

        return cls(
            sys.executable,
            dirs,
            hashlib.sha256(blob.encode()).hexdigest()[:10],
            has_setuptools=find_spec("setuptools") is not None,
        )

    def require_pip(self) -> None:
        """The new envs run the base's pip (through the .pth link); say so if there is none."""
        from importlib.util import find_spec

        if find_spec("pip") is None:
            raise DstuiError(
                f"the base environment ({self.python}) has no pip, which dstui needs to build "
                "revision environments; install it with `python -m ensurepip`"
            )


# -- planning: cheap validation and the cache key ----------------------------------


@dataclass
class EnvPlan:
    rev: Revision
    kind: str
    requested: str
    key: str = ""
    sha: str | None = None
    source: Path | None = None
    diff: bytes | None = None
    env_dir: Path | None = None
    recipe: dict[str, str] | None = None  # git: object ids of what decides a pip install (RECIPE_PATHS)
    choice: Any = None  # source_env.InstallChoice, set by build.decide_install

    @property
    def name(self) -> str:
        return self.rev.name


def plan_env(rev: Revision, root: Path, base: BaseEnv) -> EnvPlan:
    if rev.installed:
        return EnvPlan(rev, "installed", "installed")
    if rev.pypi is not None:
        version = rev.pypi.strip().removeprefix("==").removeprefix("v")
        if not re.fullmatch(r"\d+(\.\d+)*([a-zA-Z0-9.+!-]*)", version):
            raise revision_error(rev, "pypi", f"'{rev.pypi}' is not a version number (e.g. '0.18.0')")
        plan = EnvPlan(rev, "pypi", version, key=f"pypi-{version}-{base.fingerprint}")
    elif rev.git is not None:
        plan = _plan_git(rev, base)
    else:
        plan = _plan_path(rev, base)
    plan.env_dir = root / plan.key
    return plan


def revision_error(rev: Revision, field: str, message: str) -> SpecError:
    return SpecError(f"revision '{rev.name}': {message}", field=f"revisions.{rev.name}.{field}")


def _plan_git(rev: Revision, base: BaseEnv) -> EnvPlan:
    repo = Path(rev.git or "").expanduser().resolve()
    if not repo.is_dir():
        raise revision_error(rev, "git", f"no such folder {repo}")
    if run_git(repo, "rev-parse", "--git-dir", check=False).returncode != 0:
        raise revision_error(rev, "git", f"{repo} is not a git repository")
    ref = rev.ref or ""
    out = run_git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}", check=False)
    if out.returncode != 0 or not out.stdout.strip():
        known = run_git(
            repo, "for-each-ref", "--count=8", "--sort=-committerdate",
            "--format=%(refname:short)", "refs/heads", "refs/tags", check=False,
        ).stdout.split()
        hint = f" (recent branches/tags: {', '.join(known)})" if known else ""
        raise revision_error(rev, "ref", f"unknown git ref '{ref}' in {repo}{hint}")
    sha = out.stdout.strip()
    for needed in ("setup.py", "deepspeed/__init__.py"):
        if run_git(repo, "cat-file", "-e", f"{sha}:{needed}", check=False).returncode != 0:
            raise revision_error(rev, "ref", f"'{ref}' ({sha[:12]}) in {repo} is not a DeepSpeed tree (no {needed})")
    return EnvPlan(
        rev, "git", ref, key=f"git-{sha[:16]}-{base.fingerprint}", sha=sha, source=repo, recipe=recipe(repo, sha)
    )


def _plan_path(rev: Revision, base: BaseEnv) -> EnvPlan:
    tree = Path(rev.path or "").expanduser().resolve()
    if not tree.is_dir():
        raise revision_error(rev, "path", f"no such folder {tree}")
    missing = [n for n in ("setup.py", "deepspeed/__init__.py") if not (tree / n).is_file()]
    if missing:
        raise revision_error(rev, "path", f"{tree} is not a DeepSpeed tree (no {' or '.join(missing)})")
    top = run_git(tree, "rev-parse", "--show-toplevel", check=False)
    if top.returncode == 0 and Path(top.stdout.strip()).resolve() == tree:
        head = run_git(tree, "rev-parse", "--verify", "--quiet", "HEAD^{commit}", check=False)
        if head.returncode == 0:
            sha = head.stdout.strip()
            diff = _worktree_diff(tree)
            dhash = hashlib.sha256(diff).hexdigest()[:12] if diff else "clean"
            key = f"path-{sha[:16]}-{dhash}-{base.fingerprint}"
            return EnvPlan(rev, "path", str(tree), key=key, sha=sha, source=tree, diff=diff)
    # Not a git work tree (an unpacked sdist, a copy): key on the content itself.
    return EnvPlan(rev, "path", str(tree), key=f"tree-{_tree_hash(tree)[:16]}-{base.fingerprint}", source=tree)


def recipe(repo: Path, sha: str) -> dict[str, str]:
    """Git object ids of the RECIPE_PATHS at ``sha`` ('-' where absent): equal ids = equal content."""
    out = run_git(repo, "ls-tree", sha, "--", *RECIPE_PATHS).stdout
    found = {}
    for line in out.splitlines():
        meta, _, path = line.partition("\t")
        found[path] = meta.split()[2]
    return {p: found.get(p, "-") for p in RECIPE_PATHS}


def run_git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a read-only git command in ``repo``.

    GIT_OPTIONAL_LOCKS=0 stops commands like diff/status from refreshing (i.e.
    rewriting) the user's index: the clone must stay byte-for-byte untouched.
    """
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0"}
    try:
        proc = subprocess.run(
            ["git", "-C", str(repo), *args],
            capture_output=True, text=True, env=env, timeout=_GIT_TIMEOUT, check=False,
        )
    except FileNotFoundError:
        raise DstuiError("git is not installed (needed for git/path revisions)") from None
    if check and proc.returncode != 0:
        raise DstuiError(f"git {' '.join(args)} in {repo} failed: {proc.stderr.strip()}")
    return proc


def worktree_files(tree: Path) -> tuple[list[str], list[str]]:
    """Tracked files that differ from HEAD, and untracked files that are not ignored."""
    changed = run_git(tree, "diff", "HEAD", "--name-only", "--no-renames", "-z").stdout.split("\0")
    untracked = run_git(tree, "ls-files", "--others", "--exclude-standard", "-z").stdout.split("\0")
    return [c for c in changed if c], [u for u in untracked if u]


def _worktree_diff(tree: Path) -> bytes:
    """``git diff HEAD`` plus untracked files as new-file diffs: the working tree's changes.

    ``git diff --no-index`` is used for untracked files because ``git add -N``
    or a temporary index would write to the user's repository.
    """
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}
    parts = [
        subprocess.run(
            ["git", "-C", str(tree), "diff", "HEAD", "--binary", "--no-renames", "--no-color"],
            capture_output=True, env=env, timeout=_GIT_TIMEOUT, check=True,
        ).stdout
    ]
    for rel in sorted(worktree_files(tree)[1]):
        parts.append(
            subprocess.run(
                ["git", "-C", str(tree), "diff", "--no-index", "--binary", "--no-color", "--", "/dev/null", rel],
                capture_output=True, env=env, timeout=_GIT_TIMEOUT, check=False,
            ).stdout
        )
    return b"".join(parts)


def tree_files(tree: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames[:] = sorted(d for d in dirnames if d not in _TREE_SKIP and not d.endswith(".egg-info"))
        for f in sorted(filenames):
            if not f.endswith((".pyc", ".so")):
                yield Path(dirpath) / f


def _tree_hash(tree: Path) -> str:
    h = hashlib.sha256()
    for f in tree_files(tree):
        h.update(str(f.relative_to(tree)).encode() + b"\0")
        with contextlib.suppress(OSError):
            h.update(f.read_bytes())
    return h.hexdigest()


# -- PyPI ------------------------------------------------------------------------------


def check_pypi_versions(plans: list[EnvPlan], base: BaseEnv) -> None:
    """Fail fast on a PyPI version that does not exist (one ``pip index`` call).

    If the index cannot be queried (offline, a pip without ``index``) the
    check is skipped and the install itself reports the problem.
    """
    if not plans:
        return
    available = pypi_versions(base)
    if available is None:
        return
    for p in plans:
        if p.requested not in available and not any(same_version(p.requested, v) for v in available):
            raise revision_error(p.rev, "pypi", f"PyPI has no DeepSpeed release '{p.requested}'{nearby(p.requested, available)}")


def pypi_versions(base: BaseEnv) -> list[str] | None:
    try:
        proc = subprocess.run(
            [base.python, "-m", "pip", "index", "versions", "deepspeed", "--disable-pip-version-check"],
            capture_output=True, text=True, timeout=120, check=False, env=pip_env(),
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"Available versions:\s*(.+)", proc.stdout)
    if proc.returncode != 0 or not m:
        return None
    return [v.strip() for v in m.group(1).split(",") if v.strip()]


def same_version(a: str, b: str) -> bool:
    """'0.18' == '0.18.0' as pip sees it (trailing zeros do not matter)."""
    def norm(v: str) -> str:
        parts = v.split(".")
        while len(parts) > 1 and parts[-1] == "0":
            parts.pop()
        return ".".join(parts)
    return norm(a) == norm(b)


def nearby(version: str, available: list[str]) -> str:
    prefix = version.rsplit(".", 1)[0]
    close = [v for v in available if v.startswith(prefix + ".")][:6] or available[:6]
    return f" (available include: {', '.join(close)})" if close else ""


def pip_env() -> dict[str, str]:
    # PYTHONDONTWRITEBYTECODE dropped: the import check then leaves bytecode in a source-on-path env, as pip does
    env = {k: v for k, v in os.environ.items() if k not in _PIP_ENV_DROP and k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    env.update(DS_BUILD_OPS="0", PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env
