"""Building and reusing revision envs: lock, export, venv, pip, verify, marker.

A marker is written atomically only after the env was built and imported once,
so a half-built env is never reused; a failed build is removed and reported
with the tail of its (kept) build log. A file lock per key stops two dstui
processes from building the same env at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from dstui.core.errors import DstuiError, SpecError
from dstui.revisions import source_env
from dstui.revisions.plan import (
    BaseEnv,
    EnvPlan,
    nearby,
    pip_env,
    revision_error,
    same_version,
    tree_files,
    worktree_files,
)
from dstui.revisions.resolved import (
    DIFF_NAME,
    ENV_FORMAT,
    LOG_TAIL_LINES,
    MARKER,
    PTH_NAME,
    Progress,
    ResolvedRevision,
    RevisionBuildError,
)
from dstui.spec.experiment import Revision

_PIP_TIMEOUT = 3600


# -- building and reusing envs --------------------------------------------------------


def sibling_dir(env_dir: Path, suffix: str) -> Path:
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


def usable_env(plan: EnvPlan) -> bool:
    """A cached env is reused only if its marker, interpreter and deepspeed agree."""
    assert plan.env_dir is not None
    marker = _read_marker(plan.env_dir)
    return bool(
        marker
        and _env_python(plan.env_dir).exists()
        and marker.get("version")
        and _installed_version(plan.env_dir) == marker["version"]
    )


def decide_install(plan: EnvPlan, root: Path, base: BaseEnv) -> None:
    """Source-on-path or pip build (``plan.choice``); a source env gets its own key (``src-...``).

    A cached env of this commit is reused whichever way it was built (auto):
    a pip env first, then a source env; otherwise the eligibility rules of
    :mod:`dstui.revisions.source_env` decide.
    """
    if plan.kind == "installed":
        return
    if plan.key.startswith("src-"):  # deciding again (an env built since may now serve as the reference)
        plan.key = "git-" + plan.key.removeprefix("src-")
        plan.env_dir = root / plan.key
    wanted = source_env.requested_install(plan)
    src = EnvPlan(plan.rev, plan.kind, plan.requested, key="src-" + plan.key.removeprefix("git-"), sha=plan.sha)
    src.env_dir = root / src.key
    if plan.kind == "git" and wanted != "pip" and not (wanted == "auto" and usable_env(plan)) and usable_env(src):
        marker = _read_marker(src.env_dir) or {}
        reason = str((marker.get("install") or {}).get("reason") or "cached")
        plan.choice = source_env.InstallChoice("source", reason, (marker.get("install") or {}).get("reference"))
    else:
        plan.choice = source_env.choose(plan, root, base, pip_env_cached=usable_env(plan))
    if plan.choice.method == "source":
        plan.key, plan.env_dir = src.key, src.env_dir


def materialise(plan: EnvPlan, base: BaseEnv, progress: Progress) -> ResolvedRevision:
    if plan.kind == "installed":
        return _resolve_installed(plan.rev, base)
    assert plan.env_dir is not None
    env_dir = plan.env_dir
    env_dir.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()

    def say(msg: str) -> None:
        progress(f"revision '{plan.name}' ({plan.kind} {plan.requested}): {msg} [{time.monotonic() - t0:.1f}s]")

    built = False
    if not usable_env(plan):
        with _locked(sibling_dir(env_dir, ".lock"), say):
            # Another process may have finished the build while we waited.
            if not usable_env(plan):
                try:
                    _build(plan, base, say)
                except RevisionBuildError as e:
                    if plan.choice is None or plan.choice.method != "source" or source_env.requested_install(plan) != "auto":
                        raise
                    # auto: a source env that could not be made falls back to the pip build, which says why it fails
                    say(f"source-on-path environment failed, falling back to a pip build: {str(e).splitlines()[0]}")
                    return materialise(_as_pip(plan, f"source-on-path build failed: {str(e).splitlines()[0]}"), base, progress)
                built = True
    marker = _read_marker(env_dir) or {}
    install = marker.get("install") or {"method": "pip", "reason": "built before dstui recorded how"}
    if not built:
        say(f"using cached environment {env_dir.name} (DeepSpeed {marker.get('version')}, {install['method']})")
    return ResolvedRevision(
        name=plan.name,
        kind=plan.kind,
        python=str(_env_python(env_dir)),
        requested=plan.requested,
        version=str(marker["version"]),
        sha=plan.sha,
        env_dir=str(env_dir),
        diff_path=str(env_dir / DIFF_NAME) if (env_dir / DIFF_NAME).exists() else None,
        install=str(install["method"]),
    )


def _as_pip(plan: EnvPlan, reason: str) -> EnvPlan:
    assert plan.env_dir is not None
    key = "git-" + plan.key.removeprefix("src-")
    return replace(
        plan, key=key, env_dir=plan.env_dir.parent / key, choice=source_env.InstallChoice("pip", reason)
    )


def _resolve_installed(rev: Revision, base: BaseEnv) -> ResolvedRevision:
    from importlib import metadata

    try:
        dist = metadata.distribution("deepspeed")
    except metadata.PackageNotFoundError:
        raise revision_error(rev, "installed", f"DeepSpeed is not installed in this environment ({base.python})") from None
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


def _build(plan: EnvPlan, base: BaseEnv, say: Callable[[str], None]) -> None:
    assert plan.env_dir is not None
    env_dir = plan.env_dir
    log_path = sibling_dir(env_dir, ".build.log")
    if env_dir.exists():
        say("removing an unfinished environment")
        shutil.rmtree(env_dir)
    tmp_root = env_dir.parent.parent / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{plan.key}-", dir=tmp_root))
    t0 = time.monotonic()
    choice = plan.choice or source_env.InstallChoice("pip", "no install decision recorded")
    try:
        with open(log_path, "w") as log:
            log.write(f"# dstui build of revision '{plan.name}' ({plan.kind} {plan.requested}) -> {env_dir}\n")
            log.write(f"# install: {choice.method} ({choice.reason})\n")
            log.flush()
            source = choice.method == "source"
            target = None if source else _prepare_source(plan, staging, log, say)
            say("creating the environment")
            _run_logged([base.python, "-m", "venv", "--without-pip", str(env_dir)], log)
            _link_base(env_dir, base)
            if source:

                def run(cmd: list[str], capture: bool = False) -> str:
                    return _run_logged(cmd, log, capture=capture)

                source_env.build(plan, choice, env_dir, run, say)
            else:
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
                pip += ["--no-input", "--disable-pip-version-check", str(target)]
                _run_logged(pip, log, cwd=staging, say=say)
            say("checking the environment imports its own deepspeed and the base torch")
            version = _verify(plan, env_dir, log)
            if source:
                source_env.probe(plan, env_dir)
        marker = {
            "format": ENV_FORMAT, "name": plan.name, "kind": plan.kind, "requested": plan.requested,
            "version": version, "sha": plan.sha, "base_python": base.python,
            "base_site_dirs": list(base.site_dirs), "built": time.time(),
            "build_seconds": round(time.monotonic() - t0, 2),
            "install": choice.to_dict(), "recipe": plan.recipe,
            "repo": str(plan.source) if plan.source else None,
        }
        tmp = env_dir / f".{MARKER}.tmp"
        tmp.write_text(json.dumps(marker, indent=2))
        os.replace(tmp, env_dir / MARKER)
        how = "source on path, no pip build" if choice.method == "source" else "pip build"
        say(f"built DeepSpeed {version} in {time.monotonic() - t0:.1f}s ({how}: {choice.reason})")
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


def _prepare_source(plan: EnvPlan, staging: Path, log: Any, say: Callable[[str], None]) -> str:
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
        for f in tree_files(plan.source):
            dest = src / f.relative_to(plan.source)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest, follow_symlinks=False)
    return str(src)


def _overlay_worktree(tree: Path, dest: Path) -> None:
    """Make ``dest`` (a checkout of HEAD) look like the user's working tree now."""
    changed, untracked = worktree_files(tree)
    for rel in changed + untracked:
        s, d = tree / rel, dest / rel
        if s.is_symlink() or s.is_file():
            d.parent.mkdir(parents=True, exist_ok=True)
            if d.is_symlink() or d.exists():
                d.unlink()
            shutil.copy2(s, d, follow_symlinks=False)
        elif not s.exists() and (d.is_symlink() or d.is_file()):
            d.unlink()


def _link_base(env_dir: Path, base: BaseEnv) -> None:
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


def _verify(plan: EnvPlan, env_dir: Path, log: Any) -> str:
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
    if plan.kind == "pypi" and not same_version(version.split("+")[0], plan.requested):
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
        cmd, cwd=cwd, env=pip_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
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


def _build_error(plan: EnvPlan, log_path: Path, what: str) -> DstuiError:
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    text = "\n".join(lines)
    if plan.kind == "pypi" and "No matching distribution found" in text:
        versions = re.search(r"\(from versions: ([^)]*)\)", text)
        avail = [v.strip() for v in versions.group(1).split(",")][::-1] if versions else []
        return revision_error(plan.rev, "pypi", f"pip found no DeepSpeed '{plan.requested}'{nearby(plan.requested, avail)}")
    errs = [ln.strip() for ln in lines if ln.lstrip().startswith("ERROR:")]
    summary = f": {errs[-1]}" if errs else ""
    tail = "\n".join("    " + ln for ln in lines[-LOG_TAIL_LINES:])
    return RevisionBuildError(
        f"revision '{plan.name}': building its environment failed{summary} ({what})\n"
        f"  build log: {log_path} (last {min(len(lines), LOG_TAIL_LINES)} lines below)\n{tail}"
    )
