"""Source-on-path environments: a commit's checked-out source placed into a shared env, no pip build.

A pip build of a DeepSpeed commit with ``DS_BUILD_OPS=0`` (how every revision
env is built) compiles nothing: it copies the ``deepspeed`` package, writes
``deepspeed/git_version_info_installed.py`` (version, git hash, the ops table,
torch info), a dist-info folder and the ``bin/`` scripts. Everything but the
version and the git hash depends only on the *install recipe* (setup.py,
setup.cfg, pyproject.toml, MANIFEST.in, build.txt, requirements/, op_builder/,
accelerator/) and on the base environment (torch, the accelerator). So once one
commit was pip-built in a base env (the *reference*), any commit with the same
recipe gets the same install by

* checking the commit out into the env's own ``src/`` (a private clone whose
  ``.git`` is removed afterwards: the user's later checkouts cannot change it),
* linking ``site-packages/deepspeed`` to ``src/deepspeed``,
* writing the reference's version-info file with this commit's version
  (``version.txt`` + ``+`` + ``git rev-parse --short HEAD``, setup.py's rule)
  and git hash, the reference's dist-info with the new version, and the
  commit's ``bin/`` scripts with the env's interpreter, as pip does.

That takes seconds instead of a pip build. When the recipe differs from every
pip-built env (a commit that changes setup.py, its requirements or the op
builders), ``DS_BUILD_*`` asks for ops prebuilt at install, the spec says
``install: pip`` or ``DSTUI_REVISION_INSTALL=pip`` is set, the env is pip-built
and the reason is recorded in its marker. tests/e2e/test_source_env.py builds
one commit both ways and compares a verify batch's losses and gradients.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dstui.core.errors import DstuiError
from dstui.revisions.plan import RECIPE_PATHS, BaseEnv, EnvPlan, revision_error
from dstui.revisions.resolved import MARKER

#: ``pip`` forces pip builds for every git revision (e.g. for one `dstui bisect`), ``source`` asks for source envs.
OVERRIDE_ENV = "DSTUI_REVISION_INSTALL"
INFO_FILE = "git_version_info_installed.py"
SCRIPT_INSTALLER = "dstui-source-on-path\n"


@dataclass(frozen=True)
class InstallChoice:
    """How an env is built and why (recorded in its marker as ``install``)."""

    method: str  # "source" | "pip"
    reason: str
    reference: str | None = None  # env folder of the pip-built reference (source only)

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "reason": self.reason, "reference": self.reference}


def requested_install(plan: EnvPlan) -> str:
    """'auto', 'pip' or 'source': the spec's field, overridden by DSTUI_REVISION_INSTALL when that is set."""
    env = os.environ.get(OVERRIDE_ENV, "").strip().lower()
    if env and env not in ("auto", "pip", "source"):
        raise DstuiError(f"{OVERRIDE_ENV}={env!r}: use auto, pip or source")
    return env or plan.rev.install


def choose(plan: EnvPlan, root: Path, base: BaseEnv, *, pip_env_cached: bool) -> InstallChoice:
    """Source-on-path when it is known to equal a pip build of this commit, else pip (with the reason)."""
    wanted = requested_install(plan)
    by = f"{OVERRIDE_ENV}={wanted}" if os.environ.get(OVERRIDE_ENV) else f"install: {wanted}"
    if wanted == "pip":
        return InstallChoice("pip", f"pip build asked for ({by})")
    choice = _eligible(plan, root, base, pip_env_cached=pip_env_cached and wanted == "auto")
    if wanted == "source" and choice.method != "source":
        raise revision_error(plan.rev, "install", f"cannot use a source-on-path environment ({by}): {choice.reason}")
    return choice


def _eligible(plan: EnvPlan, root: Path, base: BaseEnv, *, pip_env_cached: bool) -> InstallChoice:
    if plan.kind != "git" or plan.sha is None or plan.source is None:
        return InstallChoice("pip", f"a {plan.kind} revision is pip-built (only git commits are placed on the path)")
    # DS_BUILD_<OP>=1 (or DS_BUILD_OPS=1) prebuilds ops at install, DS_BUILD_STRING changes the version; =0 is the default
    ds_build = sorted(
        k for k, v in os.environ.items() if k.startswith("DS_BUILD_") and (k == "DS_BUILD_STRING" or v.strip() not in ("", "0"))
    )
    if ds_build:
        return InstallChoice("pip", f"{', '.join(ds_build)} set: a pip build with ops prebuilt at install")
    if pip_env_cached:
        return InstallChoice("pip", "a pip-built environment of this commit is cached")
    mine = plan.recipe or {}
    refs = _pip_references(root, base)
    unusable: list[tuple[Path, str]] = []  # references with this recipe that cannot be copied from, and why
    for env_dir, marker in (r for r in refs if r[1].get("recipe") == mine):
        problem = _reference_problem(env_dir, marker)
        if problem is None:
            what = "setup.py, requirements, op_builder, ..."  # RECIPE_PATHS; the marker's `recipe` has them all
            return InstallChoice(
                "source", f"install recipe ({what}) identical to pip-built {str(marker.get('sha'))[:12]}", str(env_dir)
            )
        unusable.append((env_dir, problem))
    if unusable:
        return InstallChoice("pip", f"the pip-built reference {unusable[0][0].name} cannot serve: {unusable[0][1]}")
    if refs:
        env_dir, marker = refs[0]
        theirs = marker.get("recipe") or {}
        differ = [p for p in RECIPE_PATHS if theirs.get(p) != mine.get(p)]
        return InstallChoice(
            "pip", f"{', '.join(differ)} differ from the newest pip-built commit {str(marker.get('sha'))[:12]}: a pip build",
        )
    return InstallChoice("pip", "no pip-built environment of this base to compare with yet: this build is the reference")


def _pip_references(root: Path, base: BaseEnv) -> list[tuple[Path, dict[str, Any]]]:
    """Pip-built git envs of this base environment, newest first."""
    out = []
    for marker_path in root.glob(f"git-*-{base.fingerprint}/{MARKER}"):
        try:
            marker = json.loads(marker_path.read_text())
        except (OSError, ValueError):
            continue
        if (
            isinstance(marker, dict) and marker.get("kind") == "git" and isinstance(marker.get("recipe"), dict)
            and (marker.get("install") or {}).get("method", "pip") == "pip"
        ):
            out.append((marker_path.parent, marker))
    return sorted(out, key=lambda r: -float(r[1].get("built") or 0))


def _reference_problem(env_dir: Path, marker: dict[str, Any]) -> str | None:
    """Why a pip-built env cannot be copied from (None: it can)."""
    info = read_info(env_dir)
    if info is None:
        return f"no readable {INFO_FILE}"
    if any(info.get("installed_ops", {}).values()):
        return "it has ops prebuilt at install"
    version, git_hash = str(info.get("version", "")), str(info.get("git_hash", ""))
    if not git_hash or git_hash == "unknown" or not version.endswith(f"+{git_hash}") or version != marker.get("version"):
        return f"its version {version!r} is not setup.py's version.txt+git hash ({git_hash!r})"
    if not _dist_info(env_dir):
        return "it has no deepspeed dist-info"
    return None


def _site_packages(env_dir: Path) -> Path:
    sps = sorted(env_dir.glob("lib/python*/site-packages"))
    if len(sps) != 1:
        raise DstuiError(f"unexpected venv layout in {env_dir}")
    return sps[0]


def _dist_info(env_dir: Path) -> Path | None:
    found = sorted(_site_packages(env_dir).glob("deepspeed-*.dist-info"))
    return found[0] if len(found) == 1 else None


def _info_text(env_dir: Path) -> str | None:
    try:
        return (_site_packages(env_dir) / "deepspeed" / INFO_FILE).read_text()
    except (OSError, DstuiError):
        return None


def read_info(env_dir: Path) -> dict[str, Any] | None:
    """The version-info module setup.py wrote (a few ``name=literal`` lines), without importing it."""
    import ast

    text = _info_text(env_dir)
    if text is None:
        return None
    out: dict[str, Any] = {}
    try:
        for node in ast.parse(text).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                out[node.targets[0].id] = ast.literal_eval(node.value)
    except (SyntaxError, ValueError):
        return None
    return out


def _replace_line(text: str, name: str, value: str) -> str:
    new, n = re.subn(rf"^{name}=.*$", lambda _m: f"{name}={value!r}", text, count=1, flags=re.M)
    if n != 1:
        raise DstuiError(f"the reference's {INFO_FILE} has no '{name}=' line")
    return new


def build(
    plan: EnvPlan, choice: InstallChoice, env_dir: Path, run: Callable[..., str], say: Callable[[str], None]
) -> None:
    """Fill the (fresh, linked) venv ``env_dir`` with the commit's source; ``run`` runs a logged command."""
    assert plan.sha and plan.source and choice.reference
    reference = Path(choice.reference)
    template = _info_text(reference)
    ref_dist = _dist_info(reference)
    if template is None or ref_dist is None:
        raise DstuiError(f"the reference environment {reference.name} is gone or incomplete")
    src = env_dir / "src"
    say(f"checking out {plan.sha[:12]} from {plan.source} into the environment (source on path, no pip build)")
    # The same private clone the pip build uses: setup.py's `git rev-parse --short HEAD` gives the same hash here.
    run(["git", "clone", "--quiet", "--shared", "--no-checkout", str(plan.source), str(src)])
    run(["git", "-C", str(src), "checkout", "--quiet", "--detach", plan.sha])
    git_hash = run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture=True).strip().splitlines()[-1]
    git_branch = run(["git", "-C", str(src), "rev-parse", "--abbrev-ref", "HEAD"], capture=True).strip().splitlines()[-1]
    # No .git left: the tree no longer depends on (or can be changed through) the user's clone.
    shutil.rmtree(src / ".git")
    version = (src / "version.txt").read_text().strip() + f"+{git_hash}"
    text = _replace_line(template, "version", version)
    text = _replace_line(text, "git_hash", git_hash)
    text = _replace_line(text, "git_branch", git_branch)
    (src / "deepspeed" / INFO_FILE).write_text(text)

    sp = _site_packages(env_dir)
    (sp / "deepspeed").symlink_to(os.path.relpath(src / "deepspeed", sp))
    ref_version = str((read_info(reference) or {}).get("version", ""))
    dist = sp / ref_dist.name.replace(ref_version, version)
    dist.mkdir()
    metadata = (ref_dist / "METADATA").read_text()
    (dist / "METADATA").write_text(re.sub(r"^Version: .*$", f"Version: {version}", metadata, count=1, flags=re.M))
    for name in ("top_level.txt",):
        if (ref_dist / name).exists():
            shutil.copy2(ref_dist / name, dist / name)
    (dist / "INSTALLER").write_text(SCRIPT_INSTALLER)
    _install_scripts(reference, src, env_dir)


def _install_scripts(reference: Path, src: Path, env_dir: Path) -> None:
    """The commit's versions of the scripts pip installed into the reference's bin/, pointed at this env's python."""
    python = env_dir / "bin" / "python"
    for ref_script in sorted((reference / "bin").iterdir()):
        mine = src / "bin" / ref_script.name
        if not mine.is_file() or (env_dir / "bin" / ref_script.name).exists():
            continue
        text = mine.read_bytes()
        if text.startswith(b"#!") and b"python" in text.split(b"\n", 1)[0]:
            text = f"#!{python}\n".encode() + text.split(b"\n", 1)[1]
        out = env_dir / "bin" / ref_script.name
        out.write_bytes(text)
        out.chmod(0o755)


def probe(plan: EnvPlan, env_dir: Path) -> None:
    """After the import check: the env's deepspeed is the commit's source, not a copy of another."""
    sp = _site_packages(env_dir)
    if (sp / "deepspeed").resolve() != (env_dir / "src" / "deepspeed").resolve():
        raise DstuiError(f"revision '{plan.name}': site-packages/deepspeed does not point at the env's source")
