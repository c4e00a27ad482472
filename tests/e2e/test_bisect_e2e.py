"""`dstui bisect` on a real history: DeepSpeed releases from PyPI, one regression of ours, real runs.

The repository (built once, kept in the pytest cache: sdists are downloaded
once per machine) is the first-parent line

    A  DeepSpeed 0.18.0                 <- good
    B  DeepSpeed 0.18.1
    C  engine: ... 10x learning rate    <- the regression (loss moves from step 2)
    X  setup.py that cannot build       <- must be skipped
    D  DeepSpeed 0.18.2 (+ C's change)  <- bad

The halving search over [B, C, X, D] tests X first (it is the middle), skips
it, goes around it to C (bad) then B (good): A, X, C, B are the only envs it
tries, ceil(log2(5)) + 1 = 4. The first bisect is killed (SIGKILL) while C's
batch runs; started again, it follows that batch instead of running C again.
The second test reuses every measurement of the first (same condition, same
store): no build and no run, and a range without a change says so.

Cost: 3 env builds, 3 one-rank runs of 4 steps (each env JIT-builds DeepSpeed's
CPU shm op once: with ccache installed the 2nd and 3rd are cache hits, see
tests/helpers.py: compiler_cache_env), one failed build. Measured in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml
from helpers import mlflow_client

# one xdist worker runs the module in order: one home and env cache for both tests; the second reuses the first's measurements
pytestmark = pytest.mark.xdist_group("bisect")

RELEASES = ("0.18.0", "0.18.1", "0.18.2")
PATCH = '''

# dstui bisect test: a deliberate regression. Every optimizer step runs at 10x the configured learning rate.
_dstui_original_step = DeepSpeedEngine.step


def _dstui_step_at_10x_lr(self, *args, **kwargs):
    groups = self.optimizer.param_groups
    for group in groups:
        group["lr"] *= 10
    try:
        return _dstui_original_step(self, *args, **kwargs)
    finally:
        for group in groups:
            group["lr"] /= 10


DeepSpeedEngine.step = _dstui_step_at_10x_lr
'''
SUBJECT_C = "engine: take optimizer steps at 10x the learning rate"
GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
}  # fmt: skip


def git(repo: Path, *args: str, date: int | None = None) -> str:
    env = dict(GIT_ENV)
    if date is not None:  # fixed dates: the same shas in every session
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = f"{1700000000 + date * 3600} +0000"
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "commit.gpgsign=false", *args],
        capture_output=True, text=True, check=True, env=env,
    ).stdout.strip()


def _sdists(cache: Path) -> dict[str, Path]:
    cache.mkdir(parents=True, exist_ok=True)
    for v in RELEASES:
        if not list(cache.glob(f"deepspeed-{v}.tar.gz")):
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                 f"deepspeed=={v}", "-d", str(cache), "-q"],
                check=True, capture_output=True,
            )  # fmt: skip
    return {v: cache / f"deepspeed-{v}.tar.gz" for v in RELEASES}


def _release_tree(repo: Path, sdist: Path) -> None:
    for p in repo.iterdir():
        if p.name != ".git":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    with tarfile.open(sdist) as tar:
        for m in tar.getmembers():
            m.name = m.name.split("/", 1)[1] if "/" in m.name else ""
        tar.extractall(repo, members=[m for m in tar.getmembers() if m.name], filter="data")
    shutil.rmtree(repo / "deepspeed.egg-info", ignore_errors=True)
    for name in ("PKG-INFO", "build.txt"):
        (repo / name).unlink(missing_ok=True)


def _commit(repo: Path, subject: str, n: int) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", subject, date=n)
    return git(repo, "rev-parse", "HEAD")


def _regress(repo: Path) -> None:
    engine = repo / "deepspeed" / "runtime" / "engine.py"
    engine.write_text(engine.read_text() + PATCH)


@pytest.fixture(scope="session")
def history(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The repository above, built once per machine under the pytest cache; returns its shas by letter."""
    root = Path(request.config.cache.mkdir("dstui-bisect"))
    repo, done = root / "repo", root / "shas.json"
    if not done.exists():
        shutil.rmtree(repo, ignore_errors=True)
        repo.mkdir()
        tars = _sdists(root / "sdists")
        git(repo, "init", "-q", "-b", "master")
        shas = {}
        _release_tree(repo, tars["0.18.0"])
        shas["A"] = _commit(repo, "DeepSpeed 0.18.0", 1)
        _release_tree(repo, tars["0.18.1"])
        shas["B"] = _commit(repo, "DeepSpeed 0.18.1", 2)
        _regress(repo)
        shas["C"] = _commit(repo, SUBJECT_C, 3)
        setup = (repo / "setup.py").read_text()
        (repo / "setup.py").write_text("raise SystemExit('DSTUI-BISECT-BROKEN: this commit cannot build')\n")
        shas["X"] = _commit(repo, "setup: a commit that does not build", 4)
        (repo / "setup.py").write_text(setup)
        _release_tree(repo, tars["0.18.2"])
        _regress(repo)
        shas["D"] = _commit(repo, "DeepSpeed 0.18.2", 5)
        done.write_text(json.dumps(shas))
    return json.loads(done.read_text())


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory, history: dict[str, str], request: pytest.FixtureRequest) -> dict:
    """One dstui home, env cache and spec shared by the tests: measurements carry over."""
    home = tmp_path_factory.mktemp("bisect-home")
    spec = home / "bisect.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "bisect-test",
        "settings": {"model": "tiny-llama", "seq_length": 32, "micro_batch": 1, "steps": 4, "warmup_steps": 1,
                     "gpus": 1, "dtype": "fp32", "seed": 42, "hung_after_s": 600,
                     "torch_adam": True},  # no FusedAdam JIT build in each fresh env
        "conditions": [{"name": "z0", "zero_stage": 0}],
    }))  # fmt: skip
    env = {
        **os.environ,
        "DSTUI_HOME": str(home),
        "DSTUI_CACHE": str(home / "cache"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{home}/mlflow.db",
    }  # the three envs JIT-build DeepSpeed's shm op from the same sources: compiled once (conftest's ccache)
    env.pop("DSTUI_RUNS_DIR", None)
    repo = Path(request.config.cache.mkdir("dstui-bisect")) / "repo"
    return {"home": home, "spec": spec, "env": env, "repo": repo, "shas": history}


def bisect_argv(bench: dict, good: str, bad: str) -> list[str]:
    return [sys.executable, "-m", "dstui", "bisect", str(bench["spec"]), "--condition", "z0",
            "--repo", str(bench["repo"]), "--good", good, "--bad", bad, "--metric", "loss"]  # fmt: skip


def records(home: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (home / "runs" / "bisect").glob("*/commits/*.json")}


def runs_by_sha(home: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for spec in (home / "runs").glob("bisect-test-*/*/spec.json"):
        sha = (json.loads(spec.read_text()).get("revision_info") or {}).get("sha")
        out.setdefault(sha, []).append(str(spec.parent))
    return out


@pytest.mark.timeout(3600)
def test_bisect_names_the_commit_skips_and_resumes(bench: dict) -> None:
    shas, home = bench["shas"], bench["home"]
    argv = bisect_argv(bench, shas["A"], shas["D"])
    log1 = home / "first.log"
    t0 = time.monotonic()
    with open(log1, "w") as out:
        first = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=bench["env"], cwd=home)
        # Kill it after two steps (A measured, X skipped), while C's batch runs.
        deadline = time.monotonic() + 1500
        batch_of_c = None
        while time.monotonic() < deadline and first.poll() is None:
            rec = records(home).get(shas["C"], {})
            if rec.get("batches"):
                status = home / "runs" / rec["batches"][0] / f"z0-{shas['C'][:12]}-r0" / "status.json"
                if status.exists() and json.loads(status.read_text()).get("state") == "running":
                    batch_of_c = rec["batches"][0]
                    first.send_signal(signal.SIGKILL)
                    break
            time.sleep(0.5)
        first.wait(60)
    text1 = log1.read_text()
    assert batch_of_c and first.returncode == -signal.SIGKILL, text1
    before = records(home)
    assert before[shas["X"]]["build"] == "failed" and "DSTUI-BISECT-BROKEN" in before[shas["X"]]["build_error"]
    assert before[shas["A"]]["samples"] and not before[shas["C"]]["samples"]

    second = subprocess.run(argv, capture_output=True, text=True, env=bench["env"], cwd=home, timeout=1500)
    took = time.monotonic() - t0
    print(f"TIMING bisect with kill + resume: {took:.0f}s")
    assert second.returncode == 0, text1 + second.stdout + second.stderr
    c = shas["C"]
    assert f"first bad commit: {c[:12]} '{SUBJECT_C}'" in second.stdout, second.stdout
    assert "max |loss difference|" in second.stdout

    recs = records(home)
    tried = {s for s, r in recs.items() if r["build"]}
    assert tried == {shas["A"], shas["X"], shas["C"], shas["B"]}, "D is never built"
    assert len(tried) <= math.ceil(math.log2(5)) + 1
    assert all(r["builds"] == 1 for r in recs.values()), {s[:8]: r["builds"] for s, r in recs.items()}
    # the restart followed C's batch: no second batch, exactly one run per tested commit
    assert recs[c]["batches"] == [batch_of_c]
    assert {s: len(v) for s, v in runs_by_sha(home).items()} == {shas["A"]: 1, c: 1, shas["B"]: 1}
    assert text1.count("built DeepSpeed") + second.stdout.count("built DeepSpeed") == 3
    assert f"following batch {batch_of_c}" in second.stdout

    session = next((home / "runs" / "bisect").glob("*/*-loss"))
    progress = json.loads((session / "progress.json").read_text())
    assert progress["state"] == "done" and progress["first_bad"] == c and progress["left"] == 1
    verdicts = {t["sha"]: t["verdict"] for t in progress["tested"]}
    assert verdicts == {shas["B"]: "good", c: "bad", shas["X"]: "skip"}
    report = (session / "report.md").read_text()
    assert c[:12] in report and SUBJECT_C in report
    assert "skip (does not build" in report and "DSTUI-BISECT-BROKEN: this commit cannot build" in report

    client = mlflow_client(bench["env"]["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("bisect-test")
    tagged = client.search_runs([exp.experiment_id], f"tags.`dstui.revision.sha` = '{c}'")
    assert len(tagged) == 1 and tagged[0].data.tags["dstui.bisect.verdict"] == "bad"


@pytest.mark.timeout(1800)
def test_no_change_says_no_regression(bench: dict) -> None:
    """0.18.0 -> 0.18.1 trains identically; measurements of the first test are reused (nothing runs)."""
    shas, home = bench["shas"], bench["home"]
    before = records(home)
    proc = subprocess.run(bisect_argv(bench, shas["A"], shas["B"]), capture_output=True, text=True,
                          env=bench["env"], cwd=home, timeout=1500)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no regression found" in proc.stdout and "first bad commit" not in proc.stdout
    after = records(home)
    if before:  # ran after the first test: its results are reused, nothing built or run again
        assert {s: (r["builds"], r["batches"]) for s, r in after.items()} == {
            s: (r["builds"], r["batches"]) for s, r in before.items()
        }
    session = next((home / "runs" / "bisect").glob(f"*/{shas['A'][:10]}-{shas['B'][:10]}-loss"))
    assert json.loads((session / "progress.json").read_text())["first_bad"] is None
