"""DeepSpeed revisions in isolated cached envs (real pip, real git, no mocks).

The slow tests (``e2e``) build real environments from PyPI and from a git
repository made here out of DeepSpeed's own sdist. They share one cache
folder per module so each env is built once; the user-facing promises are
checked from the outside: the env imports its own deepspeed and the base
torch, the clone's HEAD/status/stash/worktrees and the base ``pip freeze``
are unchanged, and a second resolve reuses the cache without pip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
import yaml
from helpers import HEAVY

from dstui.core.errors import DstuiError, SpecError
from dstui.revisions import build as RB
from dstui.revisions import envs as R
from dstui.revisions import plan as RP
from dstui.revisions import resolved as RR
from dstui.spec.experiment import Revision

# one xdist worker runs the module in order: the e2e tests build into one env cache and reuse each other's envs
pytestmark = pytest.mark.xdist_group("revisions")

OLD, NEW = "0.18.0", "0.19.8"
GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
}
TIMES: dict[str, float] = {}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "commit.gpgsign=false", *args],
        capture_output=True, text=True, check=True, env=GIT_ENV,
    ).stdout


def clone_state(repo: Path) -> dict[str, str]:
    """Everything a user would notice changing in their clone."""
    return {
        "head": git(repo, "rev-parse", "HEAD"),
        "branch": git(repo, "symbolic-ref", "-q", "HEAD"),
        "status": git(repo, "status", "--porcelain", "--untracked-files=all"),
        "stash": git(repo, "stash", "list"),
        "worktrees": git(repo, "worktree", "list", "--porcelain"),
        "refs": git(repo, "for-each-ref"),
        "diff": git(repo, "diff", "HEAD"),
    }


def base_freeze() -> str:
    return subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--all"], capture_output=True, text=True, check=True
    ).stdout


def env_info(python: str) -> dict[str, str]:
    """What the env really imports (a real interpreter start, not metadata)."""
    code = (
        "import json, deepspeed, torch; print('INFO ' + json.dumps({'version': deepspeed.__version__,"
        " 'file': deepspeed.__file__, 'git_hash': deepspeed.git_hash,"
        " 'torch': torch.__version__, 'torch_file': torch.__file__}))"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True, cwd="/").stdout
    return json.loads(next(ln for ln in out.splitlines() if ln.startswith("INFO "))[5:])


# -- fixtures -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dstui-cache")


@pytest.fixture(scope="module")
def freeze_before() -> str:
    return base_freeze()


@pytest.fixture(scope="module")
def ds_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git repo made from DeepSpeed's sdist: v1 = 0.19.8, main = 0.19.9 + a marker module.

    Also a ``broken`` branch whose setup.py fails, and uncommitted changes
    (modified version.txt, an untracked module) like a developer's clone.
    """
    work = tmp_path_factory.mktemp("ds-src")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         f"deepspeed=={NEW}", "-d", str(work), "-q"],
        check=True, capture_output=True,
    )
    with tarfile.open(next(work.glob("deepspeed-*.tar.gz"))) as tar:
        tar.extractall(work, filter="data")
    repo = work / f"deepspeed-{NEW}"
    # A clone has neither build.txt (sdist-only) nor egg-info.
    (repo / "build.txt").unlink()
    subprocess.run(["rm", "-rf", "deepspeed.egg-info", "PKG-INFO"], cwd=repo, check=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "DeepSpeed 0.19.8")
    git(repo, "tag", "v1")
    (repo / "version.txt").write_text("0.19.9\n")
    (repo / "deepspeed" / "dstui_marker.py").write_text("MARK = 'main'\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "bump + marker")
    git(repo, "checkout", "-q", "-b", "broken")
    (repo / "setup.py").write_text("raise SystemExit('DSTUI-BROKEN-SETUP: this revision cannot build')\n")
    git(repo, "commit", "-q", "-am", "break setup.py")
    git(repo, "checkout", "-q", "main")
    # Uncommitted work: must be left alone by git revisions and picked up by path ones.
    (repo / "version.txt").write_text("0.19.10\n")
    (repo / "deepspeed" / "dstui_untracked.py").write_text("UNTRACKED = True\n")
    return repo


# -- unit: no network, no builds -----------------------------------------------------------


def _resolved(**kw: object) -> RR.ResolvedRevision:
    base = dict(name="new", kind="git", python=sys.executable, requested="main",
                version="0.19.9+abc1234", sha="abc1234def5678", env_dir="/x", diff_path=None)
    base.update(kw)
    return RR.ResolvedRevision(**base)  # type: ignore[arg-type]


def test_check_reported_version() -> None:
    r = _resolved()
    assert RR.check_reported_version(r, {"deepspeed": "0.19.9+abc1234"}) is None
    header = {"versions": {"deepspeed": "0.19.9+abc1234"}, "deepspeed_git_sha": "abc1234"}
    assert RR.check_reported_version(r, header) is None
    msg = RR.check_reported_version(r, {"versions": {"deepspeed": "0.19.8"}})
    assert msg and "0.19.8" in msg and "0.19.9+abc1234" in msg
    msg = RR.check_reported_version(r, {"versions": {"deepspeed": "0.19.9+abc1234"}, "deepspeed_git_sha": "fff0000"})
    assert msg and "fff0000" in msg
    assert "did not report" in (RR.check_reported_version(r, {"versions": {}}) or "")
    # 'unknown' sha (PyPI builds) is not a mismatch
    assert RR.check_reported_version(r, {"versions": {"deepspeed": r.version}, "deepspeed_git_sha": "unknown"}) is None


def test_resolved_round_trip_and_tags() -> None:
    r = _resolved()
    assert RR.ResolvedRevision.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    tags = r.mlflow_tags()
    assert tags["dstui.revision"] == "new" and tags["dstui.revision.sha"] == r.sha
    assert "dstui.revision.install" not in tags
    src = _resolved(install="source")
    assert RR.ResolvedRevision.from_dict(src.to_dict()) == src and src.mlflow_tags()["dstui.revision.install"] == "source"
    assert RR.python_for(r) == sys.executable
    assert RR.run_env(r) == {"TORCH_EXTENSIONS_DIR": "/x/torch_extensions"}
    assert RR.run_env(_resolved(kind="installed", env_dir=None)) == {}
    with pytest.raises(DstuiError, match="is gone"):
        RR.python_for(_resolved(python="/nonexistent/bin/python"))


def test_installed(tmp_path: Path) -> None:
    from importlib.metadata import version

    r = R.resolve(Revision(name="here", installed=True), cache_dir=tmp_path, progress=lambda s: None)
    assert (r.kind, r.python, r.env_dir) == ("installed", sys.executable, None)
    assert r.version.split("+")[0] == version("deepspeed")
    assert not (tmp_path / "envs").exists() or not any((tmp_path / "envs").iterdir())


def test_bad_inputs_fail_before_any_build(tmp_path: Path) -> None:
    plain = tmp_path / "not-deepspeed"
    plain.mkdir()
    (plain / "README").write_text("hi")
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "setup.py").write_text("")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "x")

    def err(rev: Revision) -> str:
        with pytest.raises(SpecError) as e:
            R.resolve(rev, cache_dir=tmp_path / "c", progress=lambda s: None)
        return str(e.value)

    assert "not a DeepSpeed tree" in err(Revision(name="p", path=str(plain)))
    assert "no such folder" in err(Revision(name="p", path=str(tmp_path / "missing")))
    assert "not a git repository" in err(Revision(name="g", git=str(plain), ref="main"))
    msg = err(Revision(name="g", git=str(repo), ref="no-such-branch"))
    assert "unknown git ref 'no-such-branch'" in msg and "main" in msg and "revisions.g.ref" in msg
    assert "not a DeepSpeed tree (no deepspeed/__init__.py)" in err(Revision(name="g", git=str(repo), ref="main"))
    # the spec refuses this at load (test_spec_validation); resolving still checks a Revision built in code
    assert "not a version number" in err(Revision.model_construct(name="v", pypi="latest", git=None, path=None, installed=False, install="auto"))
    # Every revision is checked before anything is built, and all problems are listed.
    with pytest.raises(SpecError) as e:
        R.resolve_all(
            [Revision(name="ok", pypi=OLD), Revision(name="a", path=str(plain)),
             Revision(name="b", git=str(repo), ref="nope")],
            cache_dir=tmp_path / "c", progress=lambda s: None,
        )
    assert "2 revisions are invalid" in str(e.value)
    assert not (tmp_path / "c" / "envs").exists() or not any((tmp_path / "c" / "envs").iterdir())
    with pytest.raises(SpecError, match="unique"):
        R.resolve_all([Revision(name="x", installed=True)] * 2, cache_dir=tmp_path)


# -- e2e: real envs -------------------------------------------------------------------------


@pytest.mark.e2e
def test_pypi_missing_version(cache: Path) -> None:
    with pytest.raises(SpecError, match=r"PyPI has no DeepSpeed release '0\.0\.999'") as e:
        R.resolve(Revision(name="ghost", pypi="0.0.999"), cache_dir=cache, progress=lambda s: None)
    assert "available include" in str(e.value)


@pytest.mark.e2e
def test_pypi_releases_built_isolated_and_cached(cache: Path, freeze_before: str) -> None:
    import torch

    revs = [Revision(name="stable", pypi=OLD), Revision(name="newer", pypi=NEW)]
    lines: list[str] = []
    t0 = time.monotonic()
    got = R.resolve_all(revs, cache_dir=cache, progress=lines.append)
    TIMES["pypi build (2 envs)"] = time.monotonic() - t0
    assert any("pip:" in ln for ln in lines) and all(ln.endswith("s]") for ln in lines)
    for rev, want in (("stable", OLD), ("newer", NEW)):
        r = got[rev]
        assert (r.kind, r.requested, r.version, r.sha) == ("pypi", want, want, None)
        assert Path(r.env_dir or "").parent == cache / "envs"
        info = env_info(RR.python_for(r))
        assert info["version"] == want
        assert info["file"].startswith(r.env_dir or "?"), "env must import its own deepspeed"
        assert (info["torch"], info["torch_file"]) == (torch.__version__, torch.__file__)
    markers = {n: (Path(r.env_dir or "") / RR.MARKER).stat().st_mtime_ns for n, r in got.items()}

    lines.clear()
    t0 = time.monotonic()
    again = R.resolve_all(revs, cache_dir=cache, progress=lines.append)
    TIMES["pypi cached resolve (2 envs)"] = time.monotonic() - t0
    assert again == got
    # cached: no pip, no venv (not a clock: tests run side by side on a loaded machine; TIMES has it)
    # reused: no pip output, no build, no new venv ("(DeepSpeed 0.18.0, pip)" says how the cached env was made)
    assert not any(w in ln for ln in lines for w in ("pip:", "built DeepSpeed", "creating")), lines
    assert lines and all("using cached environment" in ln for ln in lines), lines
    assert all("using cached environment" in ln for ln in lines)
    assert {n: (Path(r.env_dir or "") / RR.MARKER).stat().st_mtime_ns for n, r in again.items()} == markers
    assert base_freeze() == freeze_before


@pytest.mark.e2e
def test_git_refs_never_touch_the_clone(cache: Path, ds_repo: Path, freeze_before: str) -> None:
    before = clone_state(ds_repo)
    assert before["status"], "the fixture clone is dirty on purpose"
    revs = [Revision(name="main", git=str(ds_repo), ref="main"), Revision(name="v1", git=str(ds_repo), ref="v1")]
    t0 = time.monotonic()
    got = R.resolve_all(revs, cache_dir=cache, progress=print)
    TIMES["git build (2 envs)"] = time.monotonic() - t0
    assert clone_state(ds_repo) == before
    for name, ref, ver in (("main", "main", "0.19.9"), ("v1", "v1", NEW)):
        r = got[name]
        sha = git(ds_repo, "rev-parse", f"{ref}^{{commit}}").strip()
        assert (r.kind, r.requested, r.sha) == ("git", ref, sha)
        info = env_info(r.python)
        # Committed content only: the dirty version.txt (0.19.10) must not leak in.
        assert info["version"] == r.version and r.version.startswith(ver + "+")
        assert sha.startswith(info["git_hash"]) and r.version.endswith("+" + info["git_hash"])
        assert info["file"].startswith(r.env_dir or "?")
        has_marker = (Path(r.env_dir or "") / "lib").glob("python*/site-packages/deepspeed/dstui_marker.py")
        assert bool(list(has_marker)) == (name == "main")
        assert RR.check_reported_version(r, {"versions": {"deepspeed": info["version"]}, "deepspeed_git_sha": info["git_hash"]}) is None

    t0 = time.monotonic()
    lines: list[str] = []
    assert R.resolve_all(revs, cache_dir=cache, progress=lines.append) == got
    TIMES["git cached resolve (2 envs)"] = time.monotonic() - t0
    # cached: no export, no pip, no venv (not a clock: tests run side by side; TIMES has it)
    assert lines and all("using cached environment" in ln for ln in lines), lines
    assert clone_state(ds_repo) == before
    assert base_freeze() == freeze_before


@pytest.mark.e2e
def test_path_uses_working_tree_with_diff(cache: Path, ds_repo: Path) -> None:
    before = clone_state(ds_repo)
    t0 = time.monotonic()
    r = R.resolve(Revision(name="mywork", path=str(ds_repo)), cache_dir=cache, progress=print)
    TIMES["path build"] = time.monotonic() - t0
    assert clone_state(ds_repo) == before
    head = git(ds_repo, "rev-parse", "HEAD").strip()
    assert (r.kind, r.sha) == ("path", head)
    info = env_info(r.python)
    assert info["version"] == r.version and r.version.startswith("0.19.10+")  # the uncommitted version.txt
    sp = next(Path(r.env_dir or "").glob("lib/python*/site-packages"))
    assert (sp / "deepspeed" / "dstui_untracked.py").is_file()
    diff = Path(r.diff_path or "").read_text()
    assert "+0.19.10" in diff and "dstui_untracked.py" in diff and "UNTRACKED = True" in diff
    # Same tree -> cache hit; another change -> another env key.
    assert R.resolve(Revision(name="mywork", path=str(ds_repo)), cache_dir=cache, progress=lambda s: None) == r
    extra = ds_repo / "deepspeed" / "dstui_untracked.py"
    extra.write_text("UNTRACKED = 2\n")
    try:
        plan = RP.plan_env(Revision(name="mywork", path=str(ds_repo)), cache / "envs", RP.BaseEnv.current())
        assert plan.env_dir != Path(r.env_dir or "")
    finally:
        extra.write_text("UNTRACKED = True\n")
    assert clone_state(ds_repo) == before


@pytest.mark.e2e
def test_build_failure_is_cleaned_up_and_reported(cache: Path, ds_repo: Path) -> None:
    before = clone_state(ds_repo)
    with pytest.raises(RR.RevisionBuildError) as e:
        R.resolve(Revision(name="bad", git=str(ds_repo), ref="broken"), cache_dir=cache, progress=lambda s: None)
    msg = str(e.value)
    assert "building its environment failed" in msg and "DSTUI-BROKEN-SETUP" in msg
    sha = git(ds_repo, "rev-parse", "broken").strip()
    env_dirs = list((cache / "envs").glob(f"git-{sha[:16]}-*"))
    assert [p for p in env_dirs if p.is_dir()] == [], "a failed env must be removed"
    logs = [p for p in env_dirs if p.name.endswith(".build.log")]
    assert logs and "DSTUI-BROKEN-SETUP" in logs[0].read_text() and str(logs[0]) in msg
    assert clone_state(ds_repo) == before


@pytest.mark.e2e
def test_lock_waits_for_another_builder(cache: Path) -> None:
    """A second process finding the lock held waits, then reuses what the first built."""
    import fcntl

    rev = Revision(name="stable", pypi=OLD)
    r = R.resolve(rev, cache_dir=cache, progress=lambda s: None)
    env = Path(r.env_dir or "")
    marker = env / RR.MARKER
    saved = marker.read_bytes()
    lines: list[str] = []
    result: dict[str, RR.ResolvedRevision] = {}
    with open(RB.sibling_dir(env, ".lock"), "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # "another process" is building
        marker.unlink()  # ... and has not finished yet
        t = threading.Thread(target=lambda: result.update(r=R.resolve(rev, cache_dir=cache, progress=lines.append)))
        t.start()
        deadline = time.monotonic() + 30
        while not any("waiting for another dstui" in ln for ln in lines) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any("waiting for another dstui" in ln for ln in lines)
        marker.write_bytes(saved)  # the other builder finishes
        fcntl.flock(fh, fcntl.LOCK_UN)
    t.join(60)
    assert result["r"] == r
    assert not any("pip:" in ln or "built DeepSpeed" in ln for ln in lines), "must reuse, not rebuild"


@pytest.mark.e2e
def test_half_built_env_is_rebuilt(cache: Path) -> None:
    rev = Revision(name="stable", pypi=OLD)
    r = R.resolve(rev, cache_dir=cache, progress=lambda s: None)
    (Path(r.env_dir or "") / RR.MARKER).unlink()  # as if the build was killed before the end
    lines: list[str] = []
    t0 = time.monotonic()
    assert R.resolve(rev, cache_dir=cache, progress=lines.append) == r
    TIMES["pypi rebuild (pip wheel cache warm)"] = time.monotonic() - t0
    assert any("removing an unfinished environment" in ln for ln in lines)
    assert (Path(r.env_dir or "") / RR.MARKER).is_file()


@pytest.mark.e2e
def test_base_env_unchanged_and_times(freeze_before: str) -> None:
    assert base_freeze() == freeze_before
    for what, secs in TIMES.items():
        print(f"TIMING {what}: {secs:.2f}s")


# -- revision_compare: statistics against scipy computed here -----------------------------

from dstui.analysis import revision_compare as RC  # noqa: E402


def _samples(cond: str, rev: str, means: list[float], **kw: object) -> list[RC.RunSample]:
    return [RC.RunSample(cond, rev, iter_time_mean=m, **kw) for m in means]  # type: ignore[arg-type]


def test_compare_faster_matches_scipy() -> None:
    import numpy as np
    from scipy import stats

    base = [0.100, 0.102, 0.098, 0.101, 0.099]
    new = [0.088, 0.090, 0.087, 0.089, 0.091]
    comps = RC.compare(_samples("c", "stable", base) + _samples("c", "main", new), "stable")
    assert len(comps) == 1
    c = comps[0]
    res = stats.ttest_ind(new, base, equal_var=False)
    lo, hi = res.confidence_interval(0.95)
    bm = float(np.mean(base))
    assert c.p_value == pytest.approx(res.pvalue, rel=1e-9)
    assert c.diff_ci == pytest.approx((lo, hi), rel=1e-9)
    assert c.ratio == pytest.approx(np.mean(new) / bm)
    # Fieller's interval, solved here with numpy: (a - r b)^2 = t^2 (va + r^2 vb)
    am, va, vb = float(np.mean(new)), np.var(new, ddof=1) / 5, np.var(base, ddof=1) / 5
    r0 = am / bm
    df = (va + r0**2 * vb) ** 2 / (va**2 / 4 + r0**4 * vb**2 / 4)
    t = stats.t.ppf(0.975, df)
    roots = sorted(np.roots([bm**2 - t**2 * vb, -2 * am * bm, am**2 - t**2 * va]).real)
    assert c.ratio_ci == pytest.approx(tuple(roots), rel=1e-9)
    assert 0 < c.ratio_ci[0] < c.ratio < c.ratio_ci[1]
    assert (c.mean, c.std) == pytest.approx((np.mean(new), np.std(new, ddof=1)))
    assert (c.base_mean, c.base_std) == pytest.approx((bm, np.std(base, ddof=1)))
    assert c.significant
    pct = (1 - np.mean(new) / bm) * 100
    assert c.verdict == (
        f"faster by {pct:.0f}% (ratio {c.ratio:.3f}, 95% CI [{roots[0]:.3f}, {roots[1]:.3f}])"
    ), c.verdict


def test_compare_slower_no_change_and_untestable() -> None:
    from scipy import stats

    base = [1.00, 1.01, 0.99]
    slow = [1.20, 1.22, 1.19]
    same = [1.005, 0.995, 1.01]
    samples = (
        _samples("c", "stable", base) + _samples("c", "slow", slow) + _samples("c", "same", same)
        + _samples("c", "single", [0.5])
    )
    comps = {c.revision: c for c in RC.compare(samples, "stable")}
    assert comps["slow"].verdict.startswith("slower by 20%")
    p_same = stats.ttest_ind(same, base, equal_var=False).pvalue
    assert p_same > 0.05
    assert comps["same"].verdict == f"no significant change (ratio {sum(same) / sum(base):.3f}, p={p_same:.2g})"
    assert comps["single"].p_value is None and "not tested (fewer than 2 repeats" in comps["single"].verdict
    assert "stable" not in comps  # the baseline is not compared with itself


def test_compare_loss_memory_and_failed_runs() -> None:
    import numpy as np

    steps = list(range(1, 51))
    base_curves = [{s: 2.0 - 0.01 * s + 0.0001 * r for s in steps} for r in range(3)]
    new_curves = [dict(c) for c in base_curves]
    for c in new_curves:
        c[40] += 0.05  # a divergence at step 40 only
    samples = [
        RC.RunSample("c", "stable", 0.1 + 0.001 * i, mem_peak=1000.0 + i, loss=base_curves[i]) for i in range(3)
    ] + [
        RC.RunSample("c", "main", 0.1 + 0.001 * i, mem_peak=1500.0 + i, loss=new_curves[i]) for i in range(3)
    ] + [RC.RunSample("c", "main", None, usable=False)]
    c = RC.compare(samples, "stable", loss_tol=0.01)[0]
    base_mean = np.mean([[cv[s] for s in steps] for cv in base_curves], axis=0)
    new_mean = np.mean([[cv[s] for s in steps] for cv in new_curves], axis=0)
    diff = np.abs(new_mean - base_mean)
    assert c.loss_max_diff == pytest.approx(diff.max()) and c.loss_max_step == steps[int(diff.argmax())] == 40
    assert c.loss_steps == 50
    assert c.mem_diff == pytest.approx(500.0)
    assert (c.n, c.n_base, c.n_failed) == (3, 3, 1)
    assert "loss differs beyond tolerance at step 40" in c.verdict
    assert "failed runs excluded: 1 revision" in c.verdict
    # A NaN on one side is never parity.
    new_curves[0][10] = float("nan")
    c = RC.compare(samples, "stable", loss_tol=0.01)[0]
    assert c.loss_max_diff == float("inf") and c.loss_max_step == 10


@HEAVY
def test_compare_command_reads_mlflow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`dstui compare` over a real MLflow store laid out as the supervisor writes it."""
    import argparse

    import numpy as np
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient
    from scipy import stats

    from dstui.commands import compare as cmd

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("revs", artifact_location=(tmp_path / "art").as_uri())
    rng = np.random.default_rng(0)
    post: dict[str, list[float]] = {"stable": [], "main": []}
    for repeat in range(3):
        for rev, level in (("stable", 0.100), ("main", 0.080)):
            run = client.create_run(exp, run_name=f"base-{rev}-r{repeat}", tags={
                "dstui.role": "run", "dstui.batch": "revs-1", "dstui.condition": "base",
                "dstui.revision": rev, "dstui.repeat": str(repeat), "dstui.status": "done",
            })
            times = level + rng.normal(0, 0.002, 10)
            times[:2] = 5.0  # warm-up steps: must not count
            post[rev].append(float(times[2:].mean()))
            ms = [Metric("iter_time", float(t), 0, s + 1) for s, t in enumerate(times)]
            ms += [Metric("loss", 2.0 - 0.1 * s, 0, s + 1) for s in range(10)]
            ms += [Metric("mem_peak", 1e6 if rev == "stable" else 2e6, 0, s + 1) for s in range(10)]
            client.log_batch(run.info.run_id, metrics=ms, params=[Param("warmup_steps", "2")],
                             tags=[RunTag("x", "y")])
            client.set_terminated(run.info.run_id)
    args = argparse.Namespace(experiment="revs", baseline="stable", batch=None, loss_tol=1e-3, json=False)
    assert cmd.run(args) == 0
    out = capsys.readouterr().out
    res = stats.ttest_ind(post["main"], post["stable"], equal_var=False)
    bm = float(np.mean(post["stable"]))
    pct = (1 - np.mean(post["main"]) / bm) * 100
    assert "Welch" in out and "batch revs-1" in out
    assert f"base / main vs stable: faster by {pct:.0f}%" in out, out
    assert f"{res.pvalue:.3g}" in out and "+976.6KiB" in out
    args.json = True
    assert cmd.run(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["comparisons"][0]["p_value"] == pytest.approx(res.pvalue)
    with pytest.raises(DstuiError, match="no runs of baseline revision 'nope'"):
        cmd.run(argparse.Namespace(experiment="revs", baseline="nope", batch=None, loss_tol=1e-3, json=False))


def test_plain_tree_is_keyed_by_content(tmp_path: Path) -> None:
    """A DeepSpeed tree outside git (an unpacked sdist) gets a content-hash key, no sha."""
    tree = tmp_path / "ds"
    (tree / "deepspeed").mkdir(parents=True)
    (tree / "setup.py").write_text("")
    (tree / "deepspeed" / "__init__.py").write_text("x = 1\n")
    base = RP.BaseEnv.current()
    p1 = RP.plan_env(Revision(name="t", path=str(tree)), tmp_path / "envs", base)
    assert p1.key.startswith("tree-") and p1.sha is None and p1.kind == "path"
    (tree / "deepspeed" / "__pycache__").mkdir()
    (tree / "deepspeed" / "__pycache__" / "x.pyc").write_bytes(b"junk")  # build output: ignored
    assert RP.plan_env(Revision(name="t", path=str(tree)), tmp_path / "envs", base).key == p1.key
    (tree / "deepspeed" / "__init__.py").write_text("x = 2\n")
    assert RP.plan_env(Revision(name="t", path=str(tree)), tmp_path / "envs", base).key != p1.key


def test_install_choice_without_a_reference_and_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A git commit's recipe is its install files' object ids; with no pip-built reference it is pip-built."""
    from pydantic import ValidationError

    repo = tmp_path / "repo"
    (repo / "deepspeed").mkdir(parents=True)
    (repo / "setup.py").write_text("")
    (repo / "deepspeed" / "__init__.py").write_text("")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "one")
    (repo / "deepspeed" / "x.py").write_text("")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "two")
    base = RP.BaseEnv.current()
    one, two = (RP.plan_env(Revision(name="g", git=str(repo), ref=r), tmp_path / "envs", base) for r in ("main~1", "main"))
    assert one.recipe == two.recipe and one.recipe["setup.py"] != "-" and one.recipe["requirements"] == "-"
    choice = R.install_choice(Revision(name="g", git=str(repo), ref="main"), cache_dir=tmp_path)
    assert choice is not None and choice.method == "pip" and "this build is the reference" in choice.reason
    with pytest.raises(SpecError, match="cannot use a source-on-path environment"):
        R.install_choice(Revision(name="g", git=str(repo), ref="main", install="source"), cache_dir=tmp_path)
    with pytest.raises(SpecError, match="pypi revision is pip-built"):
        R.install_choice(Revision(name="p", pypi=OLD, install="source"), cache_dir=tmp_path)
    with pytest.raises(ValidationError):
        Revision(name="g", git=str(repo), ref="main", install="wheel")  # type: ignore[arg-type]
    monkeypatch.setenv("DSTUI_REVISION_INSTALL", "sometimes")
    with pytest.raises(DstuiError, match="DSTUI_REVISION_INSTALL='sometimes': use auto, pip or source"):
        R.install_choice(Revision(name="g", git=str(repo), ref="main"), cache_dir=tmp_path)
    assert not (tmp_path / "envs").exists() or not any((tmp_path / "envs").iterdir()), "nothing built"


# -- through the whole pipeline: runs under each revision report what they ran -----------------


@pytest.mark.e2e
@pytest.mark.timeout(1800)
def test_revisions_through_the_pipeline(
    cache: Path, ds_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CPU smoke condition under a PyPI release, a git ref and the installed DeepSpeed."""
    from helpers import dstui, mlflow_client

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.chdir(home)
    # the envs' shm op builds go through the session's ccache (conftest): a hit where sources match
    env = {"DSTUI_HOME": str(home), "DSTUI_CACHE": str(cache), "MLFLOW_TRACKING_URI": f"sqlite:///{home}/mlflow.db"}
    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
    import deepspeed  # the installed one, for the 'here' revision

    before = clone_state(ds_repo)
    spec = home / "revs.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "revs",
        "settings": {"model": "tiny-llama", "seq_length": 32, "micro_batch": 1, "steps": 3, "warmup_steps": 1,
                     "gpus": 2, "zero_stage": 1, "hung_after_s": 600,
                     "torch_adam": True},  # no FusedAdam JIT build in each fresh revision env
        "revisions": [
            {"name": "stable", "pypi": OLD},
            {"name": "main", "git": str(ds_repo), "ref": "main"},
            {"name": "here", "installed": True},
        ],
        "repeats": 1,
    }))  # fmt: skip
    proc = dstui("run", str(spec), env=env, timeout=1500)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    client = mlflow_client(env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("revs")
    runs = {r.data.tags["dstui.revision"]: r for r in client.search_runs([exp.experiment_id], "tags.`dstui.role` = 'run'")}
    main_sha = git(ds_repo, "rev-parse", "main").strip()
    want = {"stable": OLD, "here": deepspeed.__version__}
    for name, run in runs.items():
        tags = run.data.tags
        reported = tags["dstui.version.deepspeed"]  # what the running process imported
        assert reported == tags["dstui.revision.version"], (name, reported)
        if name in want:
            assert reported == want[name]
    assert runs["main"].data.tags["dstui.revision.sha"] == main_sha
    assert runs["main"].data.tags["dstui.version.deepspeed"].startswith("0.19.9")
    # the order of the runs is recorded and interleaves the revisions
    info = json.loads(next((home / "runs").glob("revs-*/batch.json")).read_text())
    assert info["runs"] == ["base-stable-r0", "base-main-r0", "base-here-r0"]
    assert clone_state(ds_repo) == before
    # a second batch reuses the cached envs: no pip, no build (so resolving takes about a second)
    dry = dstui("run", "--dry-run", "--no-validate", str(spec), env=env, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert "pip:" not in dry.stdout and "creating the environment" not in dry.stdout, dry.stdout
    assert ", cached" in dry.stdout, dry.stdout  # --dry-run looks the envs up (revisions.envs.preview_all), builds none
    out = dstui("compare", "--experiment", "revs", "--baseline", "here", env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "stable" in out.stdout and "main" in out.stdout
