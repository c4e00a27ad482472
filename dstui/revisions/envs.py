"""DeepSpeed revisions -> isolated, cached Python environments.

Seed 000 compared two DeepSpeed revisions by checking them out in the user's
clone, stashing the user's work and reinstalling DeepSpeed into the user's own
environment. Any crash in between left the user with a different DeepSpeed and
a stash to find. Here every revision gets its own small virtual environment
under ``<cache>/envs/<key>`` that

* holds only its own ``deepspeed`` (installed with ``pip --no-deps`` and
  ``DS_BUILD_OPS=0``, so nothing is compiled and torch is not reinstalled), and
* sees the base environment's packages (torch, transformers, ...) through a
  ``.pth`` file that calls ``site.addsitedir`` on the base's site folders.
  ``venv --system-site-packages`` is not enough: from a venv's Python it links
  the *base interpreter's* site-packages, not the venv's. The ``.pth`` file is
  processed after the env's own site-packages is on ``sys.path``, so the env's
  deepspeed shadows the base's one.

The user's clone is only read: a ``git clone --shared`` into a temporary
folder provides the tree to build (setup.py then records the right git hash),
and the user's environment is never written to (pip runs with the new env's
interpreter and ``--ignore-installed``, so it never uninstalls anything).

Envs are keyed by what they contain (PyPI version, commit sha, sha + hash of
the uncommitted diff) plus a fingerprint of the base environment, so a second
use is a marker-file read. A marker is written atomically only after the env
was built and imported once, so a half-built env is never reused; a failed
build is removed and reported with the tail of its (kept) build log. A file
lock per key stops two dstui processes from building the same env at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import site
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dstui.core import paths
from dstui.core.errors import DstuiError, SpecError
from dstui.spec.models import Revision

Progress = Callable[[str], None]

#: Bumped when the layout of a cached env changes, so old entries are not reused.
ENV_FORMAT = 1
MARKER = "dstui-env.json"
PTH_NAME = "_dstui_base_env.pth"
DIFF_NAME = "source.diff"
LOG_TAIL_LINES = 40
_GIT_TIMEOUT = 120
_PIP_TIMEOUT = 3600
# pip settings that would send the install somewhere other than the new env.
_PIP_ENV_DROP = ("PIP_TARGET", "PIP_PREFIX", "PIP_ROOT", "PIP_USER", "PIP_EDITABLE", "PIP_REQUIREMENT")
# Folders that are build output, not source, when hashing or copying a plain tree.
_TREE_SKIP = {".git", "build", "dist", "__pycache__", ".eggs", ".pytest_cache", ".tox", ".venv"}


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


# -- public entry points ----------------------------------------------------------


def resolve(
    rev: Revision, *, cache_dir: Path | None = None, progress: Progress = print
) -> ResolvedRevision:
    """Resolve (building its env if needed) one revision."""
    return resolve_all([rev], cache_dir=cache_dir, progress=progress)[rev.name]


def resolve_all(
    revs: list[Revision], *, cache_dir: Path | None = None, progress: Progress = print
) -> dict[str, ResolvedRevision]:
    """Resolve every revision before any run starts.

    All inputs are checked first (refs exist, paths are DeepSpeed trees, PyPI
    versions exist) so that a typo in the third revision fails in a second,
    not after the first two envs took a minute each to build.
    """
    names = [r.name for r in revs]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise SpecError(f"revision names must be unique (repeated: {', '.join(dups)})", field="revisions")
    root = (cache_dir or paths.cache_dir()) / "envs"
    base = _BaseEnv.current()
    plans: list[_Plan] = []
    errors: list[DstuiError] = []
    for rev in revs:
        try:
            plans.append(_plan(rev, root, base))
        except DstuiError as e:
            errors.append(e)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise SpecError(
            f"{len(errors)} revisions are invalid:\n" + "\n".join(f"  - {e}" for e in errors),
            field="revisions",
        )
    if any(p.kind != "installed" and not _usable(p) for p in plans):
        base.require_pip()
    _check_pypi_versions([p for p in plans if p.kind == "pypi" and not _usable(p)], base)
    return {p.name: _materialise(p, base, progress) for p in plans}


# -- the base environment --------------------------------------------------------------


@dataclass(frozen=True)
class _BaseEnv:
    """The environment dstui runs in: its interpreter and the site folders it sees."""

    python: str
    site_dirs: tuple[str, ...]
    fingerprint: str
    has_setuptools: bool = True

    @classmethod
    def current(cls) -> _BaseEnv:
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
class _Plan:
    rev: Revision
    kind: str
    requested: str
    key: str = ""
    sha: str | None = None
    source: Path | None = None
    diff: bytes | None = None
    env_dir: Path | None = None

    @property
    def name(self) -> str:
        return self.rev.name


def _plan(rev: Revision, root: Path, base: _BaseEnv) -> _Plan:
    if rev.installed:
        return _Plan(rev, "installed", "installed")
    if rev.pypi is not None:
        version = rev.pypi.strip().removeprefix("==").removeprefix("v")
        if not re.fullmatch(r"\d+(\.\d+)*([a-zA-Z0-9.+!-]*)", version):
            raise _bad(rev, "pypi", f"'{rev.pypi}' is not a version number (e.g. '0.18.0')")
        plan = _Plan(rev, "pypi", version, key=f"pypi-{version}-{base.fingerprint}")
    elif rev.git is not None:
        plan = _plan_git(rev, base)
    else:
        plan = _plan_path(rev, base)
    plan.env_dir = root / plan.key
    return plan


def _bad(rev: Revision, field: str, message: str) -> SpecError:
    return SpecError(f"revision '{rev.name}': {message}", field=f"revisions.{rev.name}.{field}")


def _plan_git(rev: Revision, base: _BaseEnv) -> _Plan:
    repo = Path(rev.git or "").expanduser().resolve()
    if not repo.is_dir():
        raise _bad(rev, "git", f"no such folder {repo}")
    if _git(repo, "rev-parse", "--git-dir", check=False).returncode != 0:
        raise _bad(rev, "git", f"{repo} is not a git repository")
    ref = rev.ref or ""
    out = _git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}", check=False)
    if out.returncode != 0 or not out.stdout.strip():
        known = _git(
            repo, "for-each-ref", "--count=8", "--sort=-committerdate",
            "--format=%(refname:short)", "refs/heads", "refs/tags", check=False,
        ).stdout.split()
        hint = f" (recent branches/tags: {', '.join(known)})" if known else ""
        raise _bad(rev, "ref", f"unknown git ref '{ref}' in {repo}{hint}")
    sha = out.stdout.strip()
    for needed in ("setup.py", "deepspeed/__init__.py"):
        if _git(repo, "cat-file", "-e", f"{sha}:{needed}", check=False).returncode != 0:
            raise _bad(rev, "ref", f"'{ref}' ({sha[:12]}) in {repo} is not a DeepSpeed tree (no {needed})")
    return _Plan(rev, "git", ref, key=f"git-{sha[:16]}-{base.fingerprint}", sha=sha, source=repo)


def _plan_path(rev: Revision, base: _BaseEnv) -> _Plan:
    tree = Path(rev.path or "").expanduser().resolve()
    if not tree.is_dir():
        raise _bad(rev, "path", f"no such folder {tree}")
    missing = [n for n in ("setup.py", "deepspeed/__init__.py") if not (tree / n).is_file()]
    if missing:
        raise _bad(rev, "path", f"{tree} is not a DeepSpeed tree (no {' or '.join(missing)})")
    top = _git(tree, "rev-parse", "--show-toplevel", check=False)
    if top.returncode == 0 and Path(top.stdout.strip()).resolve() == tree:
        head = _git(tree, "rev-parse", "--verify", "--quiet", "HEAD^{commit}", check=False)
        if head.returncode == 0:
            sha = head.stdout.strip()
            diff = _worktree_diff(tree)
            dhash = hashlib.sha256(diff).hexdigest()[:12] if diff else "clean"
            key = f"path-{sha[:16]}-{dhash}-{base.fingerprint}"
            return _Plan(rev, "path", str(tree), key=key, sha=sha, source=tree, diff=diff)
    # Not a git work tree (an unpacked sdist, a copy): key on the content itself.
    return _Plan(rev, "path", str(tree), key=f"tree-{_tree_hash(tree)[:16]}-{base.fingerprint}", source=tree)


def _git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
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


def _worktree_files(tree: Path) -> tuple[list[str], list[str]]:
    """Tracked files that differ from HEAD, and untracked files that are not ignored."""
    changed = _git(tree, "diff", "HEAD", "--name-only", "--no-renames", "-z").stdout.split("\0")
    untracked = _git(tree, "ls-files", "--others", "--exclude-standard", "-z").stdout.split("\0")
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
    for rel in sorted(_worktree_files(tree)[1]):
        parts.append(
            subprocess.run(
                ["git", "-C", str(tree), "diff", "--no-index", "--binary", "--no-color", "--", "/dev/null", rel],
                capture_output=True, env=env, timeout=_GIT_TIMEOUT, check=False,
            ).stdout
        )
    return b"".join(parts)


def _tree_files(tree: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames[:] = sorted(d for d in dirnames if d not in _TREE_SKIP and not d.endswith(".egg-info"))
        for f in sorted(filenames):
            if not f.endswith((".pyc", ".so")):
                yield Path(dirpath) / f


def _tree_hash(tree: Path) -> str:
    h = hashlib.sha256()
    for f in _tree_files(tree):
        h.update(str(f.relative_to(tree)).encode() + b"\0")
        with contextlib.suppress(OSError):
            h.update(f.read_bytes())
    return h.hexdigest()


# -- PyPI ------------------------------------------------------------------------------


def _check_pypi_versions(plans: list[_Plan], base: _BaseEnv) -> None:
    """Fail fast on a PyPI version that does not exist (one ``pip index`` call).

    If the index cannot be queried (offline, a pip without ``index``) the
    check is skipped and the install itself reports the problem.
    """
    if not plans:
        return
    available = _pypi_versions(base)
    if available is None:
        return
    for p in plans:
        if p.requested not in available and not any(_same_version(p.requested, v) for v in available):
            raise _bad(p.rev, "pypi", f"PyPI has no DeepSpeed release '{p.requested}'{_nearby(p.requested, available)}")


def _pypi_versions(base: _BaseEnv) -> list[str] | None:
    try:
        proc = subprocess.run(
            [base.python, "-m", "pip", "index", "versions", "deepspeed", "--disable-pip-version-check"],
            capture_output=True, text=True, timeout=120, check=False, env=_pip_env(),
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"Available versions:\s*(.+)", proc.stdout)
    if proc.returncode != 0 or not m:
        return None
    return [v.strip() for v in m.group(1).split(",") if v.strip()]


def _same_version(a: str, b: str) -> bool:
    """'0.18' == '0.18.0' as pip sees it (trailing zeros do not matter)."""
    def norm(v: str) -> str:
        parts = v.split(".")
        while len(parts) > 1 and parts[-1] == "0":
            parts.pop()
        return ".".join(parts)
    return norm(a) == norm(b)


def _nearby(version: str, available: list[str]) -> str:
    prefix = version.rsplit(".", 1)[0]
    close = [v for v in available if v.startswith(prefix + ".")][:6] or available[:6]
    return f" (available include: {', '.join(close)})" if close else ""


def _pip_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _PIP_ENV_DROP and k != "PYTHONPATH"}
    env.update(DS_BUILD_OPS="0", PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


# -- building and reusing envs --------------------------------------------------------


def _sibling(env_dir: Path, suffix: str) -> Path:
    """``<key><suffix>`` beside the env (not with_suffix: keys like pypi-0.18.0-... contain dots)."""
    return env_dir.parent / (env_dir.name + suffix)


def _env_python(env_dir: Path) -> Path:
    return env_dir / "bin" / "python"


def _read_marker(env_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((env_dir / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _installed_version(env_dir: Path) -> str | None:
    """deepspeed.__version__ of an env without importing deepspeed (that takes seconds).

    DeepSpeed's setup.py writes ``version='...'`` into
    ``git_version_info_installed.py``; that string is ``__version__``.
    """
    for sp in sorted(env_dir.glob("lib/python*/site-packages")):
        info = sp / "deepspeed" / "git_version_info_installed.py"
        with contextlib.suppress(OSError):
            m = re.search(r"^version\s*=\s*['\"]([^'\"]+)['\"]", info.read_text(), re.M)
            if m:
                return m.group(1)
    return None


def _usable(plan: _Plan) -> bool:
    """A cached env is reused only if its marker, interpreter and deepspeed agree."""
    assert plan.env_dir is not None
    marker = _read_marker(plan.env_dir)
    return bool(
        marker
        and _env_python(plan.env_dir).exists()
        and marker.get("version")
        and _installed_version(plan.env_dir) == marker["version"]
    )


def _materialise(plan: _Plan, base: _BaseEnv, progress: Progress) -> ResolvedRevision:
    if plan.kind == "installed":
        return _resolve_installed(plan.rev, base)
    assert plan.env_dir is not None
    env_dir = plan.env_dir
    env_dir.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()

    def say(msg: str) -> None:
        progress(f"revision '{plan.name}' ({plan.kind} {plan.requested}): {msg} [{time.monotonic() - t0:.1f}s]")

    built = False
    if not _usable(plan):
        with _locked(_sibling(env_dir, ".lock"), say):
            # Another process may have finished the build while we waited.
            if not _usable(plan):
                _build(plan, base, say)
                built = True
    marker = _read_marker(env_dir) or {}
    if not built:
        say(f"using cached environment {env_dir.name} (DeepSpeed {marker.get('version')})")
    return ResolvedRevision(
        name=plan.name,
        kind=plan.kind,
        python=str(_env_python(env_dir)),
        requested=plan.requested,
        version=str(marker["version"]),
        sha=plan.sha,
        env_dir=str(env_dir),
        diff_path=str(env_dir / DIFF_NAME) if (env_dir / DIFF_NAME).exists() else None,
    )


def _resolve_installed(rev: Revision, base: _BaseEnv) -> ResolvedRevision:
    from importlib import metadata

    try:
        dist = metadata.distribution("deepspeed")
    except metadata.PackageNotFoundError:
        raise _bad(rev, "installed", f"DeepSpeed is not installed in this environment ({base.python})") from None
    version = dist.version
    info = dist.locate_file("deepspeed/git_version_info_installed.py")
    with contextlib.suppress(OSError):
        m = re.search(r"^version\s*=\s*['\"]([^'\"]+)['\"]", Path(str(info)).read_text(), re.M)
        if m:
            version = m.group(1)
    return ResolvedRevision(rev.name, "installed", base.python, "installed", version)


@contextlib.contextmanager
def _locked(lock_path: Path, say: Callable[[str], None]) -> Iterator[None]:
    """flock so two dstui processes never build into the same folder at once."""
    with open(lock_path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another dstui process building {lock_path.stem}")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(f"{os.getpid()}\n")
            fh.flush()
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _build(plan: _Plan, base: _BaseEnv, say: Callable[[str], None]) -> None:
    assert plan.env_dir is not None
    env_dir = plan.env_dir
    log_path = _sibling(env_dir, ".build.log")
    if env_dir.exists():
        say("removing an unfinished environment")
        shutil.rmtree(env_dir)
    tmp_root = env_dir.parent.parent / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{plan.key}-", dir=tmp_root))
    t0 = time.monotonic()
    try:
        with open(log_path, "w") as log:
            log.write(f"# dstui build of revision '{plan.name}' ({plan.kind} {plan.requested}) -> {env_dir}\n")
            log.flush()
            target = _prepare_source(plan, staging, log, say)
            say("creating the environment")
            _run_logged([base.python, "-m", "venv", "--without-pip", str(env_dir)], log)
            _link_base(env_dir, base)
            if plan.diff is not None:
                (env_dir / DIFF_NAME).write_bytes(plan.diff)
            say(f"installing DeepSpeed from {target} (pip --no-deps, DS_BUILD_OPS=0)")
            # --ignore-installed: pip sees the base's deepspeed through the .pth link and
            # must neither skip the install nor try to uninstall the base's copy.
            pip = [str(_env_python(env_dir)), "-m", "pip", "install", "--no-deps", "--ignore-installed"]
            if base.has_setuptools:
                # Build against the base's torch/setuptools: no download of a build env,
                # and setup.py records the real torch version in deepspeed's install info.
                pip.append("--no-build-isolation")
            pip += ["--no-input", "--disable-pip-version-check", target]
            _run_logged(pip, log, cwd=staging, say=say)
            say("checking the environment imports its own deepspeed and the base torch")
            version = _verify(plan, env_dir, log)
        marker = {
            "format": ENV_FORMAT, "name": plan.name, "kind": plan.kind, "requested": plan.requested,
            "version": version, "sha": plan.sha, "base_python": base.python,
            "base_site_dirs": list(base.site_dirs), "built": time.time(),
            "build_seconds": round(time.monotonic() - t0, 2),
        }
        tmp = env_dir / f".{MARKER}.tmp"
        tmp.write_text(json.dumps(marker, indent=2))
        os.replace(tmp, env_dir / MARKER)
        say(f"built DeepSpeed {version} in {time.monotonic() - t0:.1f}s")
    except BaseException as e:
        # Never leave a half-built env behind; the log stays for the post-mortem.
        shutil.rmtree(env_dir, ignore_errors=True)
        if isinstance(e, SpecError):
            raise
        if isinstance(e, DstuiError | subprocess.CalledProcessError | subprocess.TimeoutExpired | OSError):
            raise _build_error(plan, log_path, str(e)) from None
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _prepare_source(plan: _Plan, staging: Path, log: Any, say: Callable[[str], None]) -> str:
    """What pip installs: a requirement (pypi) or a folder holding the tree to build."""
    if plan.kind == "pypi":
        return f"deepspeed=={plan.requested}"
    assert plan.source is not None
    src = staging / "src"
    if plan.sha:
        # A private clone sharing the user's objects: the user's clone is only read,
        # and setup.py finds a real HEAD to record as deepspeed's git hash.
        say(f"exporting {plan.sha[:12]} from {plan.source}")
        _run_logged(["git", "clone", "--quiet", "--shared", "--no-checkout", str(plan.source), str(src)], log)
        _run_logged(["git", "-C", str(src), "checkout", "--quiet", "--detach", plan.sha], log)
        if plan.kind == "path":
            _overlay_worktree(plan.source, src)
    else:
        say(f"copying {plan.source}")
        for f in _tree_files(plan.source):
            dest = src / f.relative_to(plan.source)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest, follow_symlinks=False)
    return str(src)


def _overlay_worktree(tree: Path, dest: Path) -> None:
    """Make ``dest`` (a checkout of HEAD) look like the user's working tree now."""
    changed, untracked = _worktree_files(tree)
    for rel in changed + untracked:
        s, d = tree / rel, dest / rel
        if s.is_symlink() or s.is_file():
            d.parent.mkdir(parents=True, exist_ok=True)
            if d.is_symlink() or d.exists():
                d.unlink()
            shutil.copy2(s, d, follow_symlinks=False)
        elif not s.exists() and (d.is_symlink() or d.is_file()):
            d.unlink()


def _link_base(env_dir: Path, base: _BaseEnv) -> None:
    """Let the env see the base's packages, after its own site-packages."""
    sps = list(env_dir.glob("lib/python*/site-packages"))
    if len(sps) != 1:
        raise DstuiError(f"unexpected venv layout in {env_dir}")
    lines = [f"import site; site.addsitedir({d!r})" for d in base.site_dirs]
    (sps[0] / PTH_NAME).write_text("\n".join(lines) + "\n")


_VERIFY = (
    "import json, deepspeed, torch\n"
    "print('DSTUI-VERIFY ' + json.dumps({'version': deepspeed.__version__, 'file': deepspeed.__file__,"
    " 'torch': torch.__version__, 'torch_file': torch.__file__, 'git_hash': getattr(deepspeed, 'git_hash', None)}))\n"
)


def _verify(plan: _Plan, env_dir: Path, log: Any) -> str:
    """Import deepspeed once in the new env; its reported version becomes the expected one."""
    proc = _run_logged([str(_env_python(env_dir)), "-c", _VERIFY], log, cwd=env_dir, capture=True)
    line = next((ln for ln in reversed(proc.splitlines()) if ln.startswith("DSTUI-VERIFY ")), None)
    if line is None:
        raise DstuiError(f"revision '{plan.name}': the new environment did not report a DeepSpeed version")
    info = json.loads(line.removeprefix("DSTUI-VERIFY "))
    if not str(info["file"]).startswith(str(env_dir)):
        raise DstuiError(
            f"revision '{plan.name}': the new environment imports deepspeed from {info['file']}, not its own"
        )
    version = str(info["version"])
    if _installed_version(env_dir) != version:
        raise DstuiError(f"revision '{plan.name}': installed metadata disagrees with deepspeed.__version__ {version}")
    if plan.kind == "pypi" and not _same_version(version.split("+")[0], plan.requested):
        raise DstuiError(f"revision '{plan.name}': asked for DeepSpeed {plan.requested}, pip installed {version}")
    return version


def _run_logged(
    cmd: list[str],
    log: Any,
    *,
    cwd: Path | None = None,
    say: Callable[[str], None] | None = None,
    capture: bool = False,
) -> str:
    """Run a build step with its output appended to the build log.

    pip's milestone lines are echoed through ``say`` so a long install shows
    it is alive. Raises CalledProcessError (turned into a RevisionBuildError
    with the log tail by the caller).
    """
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=_pip_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, errors="replace", start_new_session=True,
    )
    out: list[str] = []
    assert proc.stdout is not None
    milestones = ("Collecting", "Downloading", "Processing", "Building wheel", "Installing collected", "Successfully")
    for line in proc.stdout:
        log.write(line)
        if capture:
            out.append(line)
        if say and line.lstrip().startswith(milestones):
            say("pip: " + line.strip()[:120])
    log.flush()
    rc = proc.wait(timeout=_PIP_TIMEOUT)
    if rc != 0:
        log.write(f"# exit code {rc}\n")
        log.flush()
        raise subprocess.CalledProcessError(rc, cmd)
    return "".join(out)


def _build_error(plan: _Plan, log_path: Path, what: str) -> DstuiError:
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    text = "\n".join(lines)
    if plan.kind == "pypi" and "No matching distribution found" in text:
        versions = re.search(r"\(from versions: ([^)]*)\)", text)
        avail = [v.strip() for v in versions.group(1).split(",")][::-1] if versions else []
        return _bad(plan.rev, "pypi", f"pip found no DeepSpeed '{plan.requested}'{_nearby(plan.requested, avail)}")
    errs = [ln.strip() for ln in lines if ln.lstrip().startswith("ERROR:")]
    summary = f": {errs[-1]}" if errs else ""
    tail = "\n".join("    " + ln for ln in lines[-LOG_TAIL_LINES:])
    return RevisionBuildError(
        f"revision '{plan.name}': building its environment failed{summary} ({what})\n"
        f"  build log: {log_path} (last {min(len(lines), LOG_TAIL_LINES)} lines below)\n{tail}"
    )
