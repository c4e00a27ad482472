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

A git commit whose install recipe (setup.py, requirements, op builders, ...)
equals that of a pip-built env of the same base gets a *source-on-path* env
instead (``src-<sha>-...``: the commit checked out into the env, no pip build;
:mod:`dstui.revisions.source_env`), in seconds; the marker records which way
an env was built and why (``install``).

Envs are keyed by what they contain (PyPI version, commit sha, sha + hash of
the uncommitted diff) plus a fingerprint of the base environment, so a second
use is a marker-file read. A marker is written atomically only after the env
was built and imported once, so a half-built env is never reused; a failed
build is removed and reported with the tail of its (kept) build log. A file
lock per key stops two dstui processes from building the same env at once.

This module is the entry point (:func:`resolve`, :func:`resolve_all`); the parts
live beside it: ``resolved`` (what a resolved revision is), ``plan`` (validation
and cache keys), ``build`` (building and reusing envs), ``history`` (commit lists).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dstui.core import paths
from dstui.core.errors import DstuiError, SpecError
from dstui.revisions.build import decide_install, materialise, usable_env
from dstui.revisions.plan import BaseEnv, EnvPlan, check_pypi_versions, plan_env
from dstui.revisions.resolved import (
    Progress,
    ResolvedRevision,
)
from dstui.revisions.source_env import InstallChoice
from dstui.spec.experiment import Revision
from dstui.spec.loading import check_revision_names

__all__ = ["install_choice", "is_cached", "preview_all", "resolve", "resolve_all"]


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
    check_revision_names(revs)
    root = (cache_dir or paths.cache_dir()) / "envs"
    base = BaseEnv.current()
    plans: list[EnvPlan] = []
    errors: list[DstuiError] = []
    for rev in revs:
        try:
            plan = plan_env(rev, root, base)
            decide_install(plan, root, base)
            plans.append(plan)
        except DstuiError as e:
            errors.append(e)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise SpecError(
            f"{len(errors)} revisions are invalid:\n" + "\n".join(f"  - {e}" for e in errors),
            field="revisions",
        )
    if any(p.kind != "installed" and not usable_env(p) for p in plans):
        base.require_pip()
    check_pypi_versions([p for p in plans if p.kind == "pypi" and not usable_env(p)], base)
    out = {}
    for p in plans:
        if p.kind == "git" and not usable_env(p):
            # an env built just before (an earlier revision of this spec) may now be the reference
            decide_install(p, root, base)
        out[p.name] = materialise(p, base, progress)
    return out


def preview_all(revs: list[Revision], *, cache_dir: Path | None = None) -> dict[str, dict[str, Any]]:
    """What resolving ``revs`` would do, building nothing (`dstui run --dry-run`; a pip build took 57 s there).

    Each revision's interpreter (its env's, built or not), whether that env is cached, and how it
    would be made and why. The inputs are checked as :func:`resolve_all` checks them (names, refs
    that exist, paths that are DeepSpeed trees); PyPI versions are not looked up (a network call
    a dry run need not make: the launch checks them).
    """
    check_revision_names(revs)
    root, base = (cache_dir or paths.cache_dir()) / "envs", BaseEnv.current()
    out: dict[str, dict[str, Any]] = {}
    for rev in revs:
        plan = plan_env(rev, root, base)
        decide_install(plan, root, base)
        installed = plan.kind == "installed"
        out[rev.name] = {
            "name": rev.name, "kind": plan.kind, "requested": plan.requested, "sha": plan.sha,
            "python": base.python if installed else str(plan.env_dir / "bin" / "python"),
            "env_dir": None if installed else str(plan.env_dir), "cached": installed or usable_env(plan),
            "install": plan.choice.method if plan.choice else None, "install_reason": plan.choice.reason if plan.choice else None,
        }  # fmt: skip
    return out


def install_choice(rev: Revision, *, cache_dir: Path | None = None) -> InstallChoice | None:
    """How resolving ``rev`` now would get its env (source on path or pip) and why; None for ``installed``."""
    root, base = (cache_dir or paths.cache_dir()) / "envs", BaseEnv.current()
    plan = plan_env(rev, root, base)
    decide_install(plan, root, base)
    return plan.choice


def is_cached(rev: Revision, *, cache_dir: Path | None = None) -> bool:
    """Whether the revision's env is built and usable (so resolving it builds nothing)."""
    if rev.installed:
        return True
    root, base = (cache_dir or paths.cache_dir()) / "envs", BaseEnv.current()
    plan = plan_env(rev, root, base)
    decide_install(plan, root, base)
    return usable_env(plan)
