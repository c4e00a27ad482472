"""Source-on-path revision envs (issue 30 part 3): the commit's source in a shared env equals a pip build.

The repository, built once per machine under the pytest cache (the sdist is
downloaded once), is

    A  DeepSpeed 0.18.0 (a real release tree)
    B  A + a new module                  <- same install recipe: source on path
    B2 B + another module                <- same recipe, used for the DS_BUILD_* rule
    R  B2 + one more requirement         <- recipe differs: falls back to the pip build

One commit (A) is built both ways (``install: pip`` and ``install: source``) and
one ``kind: verify`` batch (ZeRO-1 against plain PyTorch, one rank, 3 steps) runs
under each: every step's loss, grad norm and parity differences, the versions
the runs report and the installed package files must be identical.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import deepspeed_sdists
import pytest
import yaml
from helpers import SPECS, dstui, git_at

from dstui.core.errors import SpecError
from dstui.revisions import envs as R
from dstui.revisions import resolved as RR
from dstui.spec.experiment import Revision

# one xdist worker runs the module in order: the second test uses the first one's pip-built reference
pytestmark = pytest.mark.xdist_group("source-env")

RELEASE = "0.18.0"
# step fields that do not depend on wall-clock or memory: these must be bit-identical
EXACT = ("loss", "loss_baseline", "loss_diff", "grad_norm", "grad_norm_baseline", "grad_max_abs_diff",
         "param_max_abs_diff", "within_tol", "lr")  # fmt: skip
git = git_at  # the fixed-author, fixed-date git of tests/helpers.py


def _commit(repo: Path, subject: str, n: int) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", subject, date=n)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="session")
def history(request: pytest.FixtureRequest) -> dict:
    """The repository above, built once per machine; its path and shas by letter."""
    root = Path(request.config.cache.mkdir("dstui-source-env"))
    repo, done = root / "repo", root / "shas.json"
    if not done.exists():
        shutil.rmtree(repo, ignore_errors=True)
        repo.mkdir()
        deepspeed_sdists.unpack_as_clone(deepspeed_sdists.download(RELEASE, root / "sdists"), repo)
        git(repo, "init", "-q", "-b", "master")
        shas = {"A": _commit(repo, f"DeepSpeed {RELEASE}", 1)}
        (repo / "deepspeed" / "dstui_probe.py").write_text("COMMIT = 'B'\n")
        shas["B"] = _commit(repo, "a new module", 2)
        (repo / "deepspeed" / "dstui_probe2.py").write_text("COMMIT = 'B2'\n")
        shas["B2"] = _commit(repo, "another module", 3)
        with open(repo / "requirements" / "requirements.txt", "a") as f:
            f.write("tomli-w\n")
        shas["R"] = _commit(repo, "requirements: one more dependency", 4)
        done.write_text(json.dumps(shas))
    return {"repo": repo, **json.loads(done.read_text())}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("source-env-cache")


def rev(history: dict, letter: str, name: str | None = None, install: str = "auto") -> Revision:
    return Revision(name=name or letter.lower(), git=str(history["repo"]), ref=history[letter], install=install)


def records(run: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]


def package_digest(env_dir: str) -> dict[str, str]:
    """Every file of the env's installed deepspeed package (links followed), by content."""
    (sp,) = Path(env_dir).glob("lib/python*/site-packages")
    pkg = (sp / "deepspeed").resolve()
    return {
        str(p.relative_to(pkg)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(pkg.rglob("*")) if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.mark.timeout(1800)
def test_source_env_gives_the_pip_builds_verify_results(history: dict, cache: Path, tmp_path: Path) -> None:
    said: list[str] = []
    pip = R.resolve(rev(history, "A", "pip", install="pip"), cache_dir=cache, progress=said.append)
    src = R.resolve(rev(history, "A", "src", install="source"), cache_dir=cache, progress=said.append)
    assert (pip.install, src.install) == ("pip", "source")
    assert src.env_dir != pip.env_dir and Path(src.env_dir or "").name.startswith("src-")
    assert src.version == pip.version == f"{RELEASE}+{history['A'][:7]}"
    assert package_digest(src.env_dir or "") == package_digest(pip.env_dir or ""), "same files, same bytes"
    marker = json.loads((Path(src.env_dir or "") / RR.MARKER).read_text())
    assert marker["install"]["method"] == "source" and "identical to pip-built" in marker["install"]["reason"]
    assert marker["install"]["reference"] == pip.env_dir
    assert not (Path(src.env_dir or "") / "src" / ".git").exists()
    assert any("source on path, no pip build" in s for s in said), said

    home = tmp_path / "home"
    home.mkdir()
    spec = yaml.safe_load((SPECS / "verify_zero.yaml").read_text())
    spec["name"] = "source-env"
    spec["settings"].update(steps=3, gpus=1, micro_batch=1, hung_after_s=600)  # one rank: the smallest verify run
    spec["conditions"] = [{"name": "z1", "zero_stage": 1}]
    spec["revisions"] = [
        {"name": "pip", "git": str(history["repo"]), "ref": history["A"], "install": "pip"},
        {"name": "src", "git": str(history["repo"]), "ref": history["A"], "install": "source"},
    ]
    (home / "spec.yaml").write_text(yaml.safe_dump(spec))
    env = {"DSTUI_HOME": str(home), "DSTUI_CACHE": str(cache), "MLFLOW_TRACKING_URI": f"sqlite:///{home}/mlflow.db"}
    proc = dstui("run", "--quiet", str(home / "spec.yaml"), env=env, timeout=1500)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (batch,) = [p for p in (home / "runs").glob("source-env-*") if p.is_dir()]
    out = {name: records(batch / f"z1-{name}-r0") for name in ("pip", "src")}
    steps = {n: [r for r in recs if r.get("type") == "step"] for n, recs in out.items()}
    assert len(steps["pip"]) == 3
    assert [[s[k] for k in EXACT] for s in steps["src"]] == [[s[k] for k in EXACT] for s in steps["pip"]]
    headers = {n: next(r for r in recs if r.get("type") == "header") for n, recs in out.items()}
    assert headers["src"]["versions"]["deepspeed"] == headers["pip"]["versions"]["deepspeed"] == pip.version
    assert headers["src"]["deepspeed_git_sha"] == headers["pip"]["deepspeed_git_sha"] == history["A"][:7]
    verdicts = {n: [r.get("verdict") for r in recs if r.get("type") == "summary" and r.get("verdict")] for n, recs in out.items()}
    assert verdicts["src"] == verdicts["pip"] == ["PASS"]
    infos = {n: json.loads((batch / f"z1-{n}-r0" / "spec.json").read_text())["revision_info"] for n in out}
    assert (infos["pip"]["install"], infos["src"]["install"]) == ("pip", "source")


@pytest.mark.timeout(900)
def test_auto_places_source_and_falls_back_to_pip(history: dict, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After one pip build (A, the reference) a commit with the same recipe is a source env; R is pip-built."""
    R.resolve(rev(history, "A", "ref", install="pip"), cache_dir=cache, progress=lambda s: None)  # cached by now
    b = R.resolve(rev(history, "B"), cache_dir=cache, progress=lambda s: None)
    assert b.install == "source" and b.version == f"{RELEASE}+{history['B'][:7]}"
    code = "import deepspeed, deepspeed.dstui_probe as p; print('PROBE', deepspeed.git_hash, p.COMMIT)"
    out = subprocess.run([b.python, "-c", code], capture_output=True, text=True, check=True, cwd="/").stdout
    assert next(ln for ln in out.splitlines() if ln.startswith("PROBE ")).split()[1:] == [history["B"][:7], "B"]
    # the user's later checkouts do not reach the env: its source is its own copy
    repo = history["repo"]
    git(repo, "checkout", "-q", history["A"])
    try:
        assert not (repo / "deepspeed" / "dstui_probe.py").exists()
        assert (Path(b.env_dir or "") / "src" / "deepspeed" / "dstui_probe.py").read_text() == "COMMIT = 'B'\n"
    finally:
        git(repo, "checkout", "-q", "master")
    assert R.install_choice(rev(history, "B"), cache_dir=cache).method == "source"  # cached now

    # R changed its requirements: pip build, and the marker-to-be says why
    r = R.install_choice(rev(history, "R"), cache_dir=cache)
    assert r is not None and r.method == "pip" and "requirements differ" in r.reason, r
    with pytest.raises(SpecError, match="requirements differ"):
        R.install_choice(rev(history, "R", install="source"), cache_dir=cache)
    # same recipe, but ops asked prebuilt at install / a user override: pip as well
    assert R.install_choice(rev(history, "B2"), cache_dir=cache).method == "source"
    monkeypatch.setenv("DS_BUILD_CPU_ADAM", "1")
    c = R.install_choice(rev(history, "B2"), cache_dir=cache)
    assert c is not None and (c.method, c.reason.split(" set")[0]) == ("pip", "DS_BUILD_CPU_ADAM")
    monkeypatch.delenv("DS_BUILD_CPU_ADAM")
    monkeypatch.setenv("DSTUI_REVISION_INSTALL", "pip")
    c = R.install_choice(rev(history, "B2"), cache_dir=cache)
    assert c is not None and c.method == "pip" and "DSTUI_REVISION_INSTALL=pip" in c.reason
    assert R.install_choice(rev(history, "B"), cache_dir=cache).method == "pip"  # even with B's source env cached
