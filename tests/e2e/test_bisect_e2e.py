"""`dstui bisect` on a real history: DeepSpeed releases from PyPI, injected bugs, real verify runs.

The repository (built once, kept in the pytest cache: sdists are downloaded
once per machine) is the first-parent line

    A  DeepSpeed 0.18.0                      tag v0.18.0   <- good
    B  DeepSpeed 0.18.1                      tag v0.18.1
    G  zero: ZeRO-1/2 gradients scaled by 2  <- the gradient bug (verify FAILs; the loss moves by ~1e-7)
    C  engine: 10x learning rate             <- the loss regression
    K  ZeRO's optimizer raises at start-up   <- builds, but every ZeRO run crashes: skipped
    X  setup.py that cannot build            <- never reached by these searches
    D  DeepSpeed 0.18.2 (+ G and C)          tag v0.18.2   <- bad

and one condition: a `kind: verify` batch (ZeRO-2 against plain PyTorch, 1 rank, 3 steps).

1. `--metric verdict` A..D tests K (crash: skip), C (FAIL), G (FAIL), B (PASS) and names G;
   A is never built (a verdict needs no baseline). It is SIGKILLed while C's batch runs and,
   started again, follows that batch.
2. The release walk 0.18.0..0.18.2 over a local package index (find-links, no network): real
   0.18.0 and 0.18.1 sdists and, as "0.18.2", the sdist of tree D (a doctored release: no real
   DeepSpeed release has this bug). It tests 0.18.2 (FAIL) and 0.18.1 (PASS), names 0.18.2, and with
   --repo walks v0.18.1..v0.18.2, every commit's verdict reused from test 1.
3. On the same runs, `--metric loss` B..D names C, not G: the loss misses the gradient bug;
   `--metric grad_norm/grad_norm_baseline` names G again; A..B has no regression. Nothing new runs.

Cost: 6 env builds (K, C, G, B from git; 0.18.2 and 0.18.1 from the local index) and 6 verify
runs, one of them crashing at start-up. Measured in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import deepspeed_sdists
import pytest
import yaml
from helpers import git_at, mlflow_client

# one xdist worker runs the module in order: one home and env cache; later tests reuse the first's results
pytestmark = pytest.mark.xdist_group("bisect")

RELEASES = ("0.18.0", "0.18.1", "0.18.2")
LR_BUG = '''

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
GRAD_BUG = '''

# dstui bisect test: a deliberate gradient bug. ZeRO-1/2 scale every reduced gradient bucket by 2
# (Adam is nearly blind to a constant factor: the loss moves by ~1e-7, the gradients by 2x).
_dstui_original_average_tensor = DeepSpeedZeroOptimizer.average_tensor


def _dstui_average_tensor_doubled(self, tensor, *args, **kwargs):
    tensor.mul_(2.0)
    return _dstui_original_average_tensor(self, tensor, *args, **kwargs)


DeepSpeedZeroOptimizer.average_tensor = _dstui_average_tensor_doubled
'''
CRASH = '''

def _dstui_crash(self, *args, **kwargs):
    raise RuntimeError("DSTUI-BISECT-CRASH: ZeRO's optimizer cannot start at this commit")


DeepSpeedZeroOptimizer.__init__ = _dstui_crash
'''
SUBJECT_G = "zero: scale reduced gradients by 2 in ZeRO-1/2"
SUBJECT_C = "engine: take optimizer steps at 10x the learning rate"
SUBJECT_K = "zero: an optimizer that crashes at start-up"
git = git_at  # the fixed-author, fixed-date git of tests/helpers.py


def _sdists(cache: Path) -> dict[str, Path]:
    return {v: deepspeed_sdists.download(v, cache) for v in RELEASES}


def _commit(repo: Path, subject: str, n: int) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", subject, date=n)
    return git(repo, "rev-parse", "HEAD")


def _append(repo: Path, rel: str, text: str) -> None:
    f = repo / rel
    f.write_text(f.read_text() + text)


ZERO12 = "deepspeed/runtime/zero/stage_1_and_2.py"
ENGINE = "deepspeed/runtime/engine.py"


@pytest.fixture(scope="session")
def history(request: pytest.FixtureRequest) -> dict[str, str]:
    """The repository above, built once per machine under the pytest cache; returns its shas by letter."""
    root = Path(request.config.cache.mkdir("dstui-bisect"))
    repo, done = root / "repo-verify", root / "shas-verify.json"
    if not done.exists():
        shutil.rmtree(repo, ignore_errors=True)
        repo.mkdir()
        tars = _sdists(root / "sdists")
        git(repo, "init", "-q", "-b", "master")
        shas = {}
        deepspeed_sdists.unpack_as_clone(tars["0.18.0"], repo)
        shas["A"] = _commit(repo, "DeepSpeed 0.18.0", 1)
        git(repo, "tag", "v0.18.0")
        deepspeed_sdists.unpack_as_clone(tars["0.18.1"], repo)
        shas["B"] = _commit(repo, "DeepSpeed 0.18.1", 2)
        git(repo, "tag", "v0.18.1")
        _append(repo, ZERO12, GRAD_BUG)
        shas["G"] = _commit(repo, SUBJECT_G, 3)
        _append(repo, ENGINE, LR_BUG)
        shas["C"] = _commit(repo, SUBJECT_C, 4)
        _append(repo, ZERO12, CRASH)
        shas["K"] = _commit(repo, SUBJECT_K, 5)
        (repo / "setup.py").write_text("raise SystemExit('DSTUI-BISECT-BROKEN: this commit cannot build')\n")
        shas["X"] = _commit(repo, "setup: a commit that does not build", 6)
        deepspeed_sdists.unpack_as_clone(tars["0.18.2"], repo)
        _append(repo, ZERO12, GRAD_BUG)
        _append(repo, ENGINE, LR_BUG)
        shas["D"] = _commit(repo, "DeepSpeed 0.18.2", 7)
        git(repo, "tag", "v0.18.2")
        done.write_text(json.dumps(shas))
    return json.loads(done.read_text())


def _local_index(root: Path, repo: Path, shas: dict[str, str]) -> Path:
    """A find-links folder: the real 0.18.0 and 0.18.1 sdists, and as 0.18.2 the real 0.18.2 sdist with D's bugs.

    Only the two files that G and C change are replaced (from tree D); the sdist's own
    PKG-INFO and build.txt stay, so pip sees the version it expects.
    """
    index = root / "index-verify"
    doctored = index / "deepspeed-0.18.2.tar.gz"
    if not doctored.exists():
        index.mkdir(parents=True, exist_ok=True)
        for v in ("0.18.0", "0.18.1"):
            shutil.copy(root / "sdists" / f"deepspeed-{v}.tar.gz", index)
        patched = {f"deepspeed-0.18.2/{rel}": git(repo, "show", f"{shas['D']}:{rel}").encode() + b"\n"
                   for rel in (ZERO12, ENGINE)}  # fmt: skip
        tmp = index / "doctored.tmp"
        with tarfile.open(root / "sdists" / "deepspeed-0.18.2.tar.gz") as src, tarfile.open(tmp, "w:gz") as dst:
            for m in src.getmembers():
                if m.name in patched:
                    m.size = len(patched[m.name])
                    dst.addfile(m, io.BytesIO(patched.pop(m.name)))
                else:
                    dst.addfile(m, src.extractfile(m) if m.isfile() else None)
        assert not patched, f"not in the 0.18.2 sdist: {sorted(patched)}"
        tmp.rename(doctored)
    return index


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory, history: dict[str, str], request: pytest.FixtureRequest) -> dict:
    """One dstui home, env cache, spec and package index shared by the tests: measurements carry over."""
    home = tmp_path_factory.mktemp("bisect-home")
    spec = home / "bisect.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "bisect-test",
        "settings": {"model": "tiny-llama", "seq_length": 32, "micro_batch": 1, "steps": 3, "warmup_steps": 0,
                     "gpus": 1, "dtype": "fp32", "seed": 42, "hung_after_s": 600, "kind": "verify",
                     "torch_adam": True},  # no FusedAdam JIT build in each fresh env
        "conditions": [{"name": "z2", "zero_stage": 2}, {"name": "train", "kind": "train"}],
    }))  # fmt: skip
    root = Path(request.config.cache.mkdir("dstui-bisect"))
    repo = root / "repo-verify"
    env = {
        **os.environ,
        "DSTUI_HOME": str(home),
        "DSTUI_CACHE": str(home / "cache"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{home}/mlflow.db",
        # the package index is a local folder: the release walk lists and installs from it, offline
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(_local_index(root, repo, history)),
    }  # the envs JIT-build DeepSpeed's shm op from the same sources: compiled once (conftest's ccache)
    env.pop("DSTUI_RUNS_DIR", None)
    env.pop("PIP_INDEX_URL", None)
    return {"home": home, "spec": spec, "env": env, "repo": repo, "shas": history}


def bisect_argv(bench: dict, good: str, bad: str, *extra: str, metric: str = "verdict") -> list[str]:
    return [sys.executable, "-m", "dstui", "bisect", str(bench["spec"]), "--condition", "z2",
            "--good", good, "--bad", bad, "--metric", metric, *extra]  # fmt: skip


def with_repo(bench: dict) -> tuple[str, str]:
    return ("--repo", str(bench["repo"]))


def records(home: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (home / "runs" / "bisect").glob("*/commits/*.json")}


def runs_by_sha(home: Path) -> dict[str, int]:
    """How many runs each revision got (git revisions by sha, PyPI ones by version)."""
    out: dict[str, int] = {}
    for spec in (home / "runs").glob("bisect-test-*/*/spec.json"):
        info = json.loads(spec.read_text()).get("revision_info") or {}
        key = info.get("sha") or f"pypi-{info.get('requested')}"
        out[key] = out.get(key, 0) + 1
    return out


def session(home: Path, suffix: str) -> Path:
    return next((home / "runs" / "bisect").glob(f"*/{suffix}"))


def run_bisect(bench: dict, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=bench["env"], cwd=bench["home"], timeout=2400)


@pytest.mark.timeout(3600)
def test_verdict_names_the_gradient_bug_skips_a_crash_and_resumes(bench: dict) -> None:
    shas, home = bench["shas"], bench["home"]
    argv = bisect_argv(bench, shas["A"], shas["D"], *with_repo(bench))
    log1 = home / "first.log"
    t0 = time.monotonic()
    with open(log1, "w") as out:
        first = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=bench["env"], cwd=home)
        # Kill it after K was skipped, while C's batch runs.
        deadline = time.monotonic() + 2400
        batch_of_c = None
        while time.monotonic() < deadline and first.poll() is None:
            rec = records(home).get(shas["C"], {})
            if rec.get("batches"):
                status = home / "runs" / rec["batches"][0] / f"z2-{shas['C'][:12]}-r0" / "status.json"
                if status.exists() and json.loads(status.read_text()).get("state") == "running":
                    batch_of_c = rec["batches"][0]
                    first.send_signal(signal.SIGKILL)
                    break
            time.sleep(0.5)
        first.wait(60)
    text1 = log1.read_text()
    assert batch_of_c and first.returncode == -signal.SIGKILL, text1
    before = records(home)
    k = before[shas["K"]]
    assert k["build"] == "ok" and k["samples"] and not k["samples"][0]["usable"], k
    assert not before[shas["C"]]["samples"]
    # progress while it works: what is built or run, outcomes left, a log2 estimate of the tests left
    assert "[7 outcomes left, about 3 more tests] testing commit" in text1, text1
    progress = json.loads((session(home, "*-verdict") / "progress.json").read_text())
    assert progress["current"]["sha"] == shas["C"] and progress["phase"] == "running"
    assert progress["current"]["batch"] == batch_of_c and progress["tests_left"] >= 1

    second = run_bisect(bench, argv)
    took = time.monotonic() - t0
    print(f"TIMING verdict bisect with kill + resume: {took:.0f}s")
    assert second.returncode == 0, text1 + second.stdout + second.stderr
    g = shas["G"]
    assert f"first bad commit: {g[:12]} '{SUBJECT_G}': verify FAIL at step 1" in second.stdout, second.stdout
    assert f"following batch {batch_of_c}" in second.stdout

    recs = records(home)
    tried = {s for s, r in recs.items() if r["build"]}
    assert tried == {shas["K"], shas["C"], g, shas["B"]}, "A (no baseline needed), X and D are never built"
    assert all(r["builds"] == 1 for r in recs.values()), {s[:8]: r["builds"] for s, r in recs.items()}
    assert recs[shas["C"]]["batches"] == [batch_of_c], "the restart followed C's batch"
    assert runs_by_sha(home) == {shas["K"]: 1, shas["C"]: 1, g: 1, shas["B"]: 1}

    progress = json.loads((session(home, "*-verdict") / "progress.json").read_text())
    assert progress["state"] == "done" and progress["first_bad"] == g and progress["noun"] == "commit"
    assert [(p["sha"], p["verdict"]) for p in progress["path"]] == [
        (shas["K"], "skip"), (shas["C"], "bad"), (g, "bad"), (shas["B"], "good")]  # fmt: skip
    report = (session(home, "*-verdict") / "report.md").read_text()
    assert "search path" in report and f"`{shas['K'][:12]}` skip -> `{shas['C'][:12]}` bad" in report
    assert "skip (no verdict (crashed" in report and SUBJECT_G in report
    assert "not run (the answer does not rest on it)" in report

    client = mlflow_client(bench["env"]["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("bisect-test")
    tagged = client.search_runs([exp.experiment_id], f"tags.`dstui.revision.sha` = '{g}'")
    assert len(tagged) == 1 and tagged[0].data.tags["dstui.bisect.verdict"] == "bad"


@pytest.mark.timeout(3600)
def test_release_walk_names_the_first_bad_release_then_the_commit(bench: dict) -> None:
    """0.18.0 .. 0.18.2 from the local index: 0.18.2 FAILs, 0.18.1 PASSes; then v0.18.1..v0.18.2 in the clone."""
    shas, home = bench["shas"], bench["home"]
    t0 = time.monotonic()
    walk = run_bisect(bench, bisect_argv(bench, "0.18.0", "0.18.2", *with_repo(bench)))
    print(f"TIMING release walk + commits: {time.monotonic() - t0:.0f}s")
    out = walk.stdout
    assert walk.returncode == 0, out + walk.stderr
    assert "bisect verdict of 'z2': 2 releases after good 0.18.0 up to bad 0.18.2" in out, out
    assert "first bad release: 0.18.2 'DeepSpeed 0.18.2 (PyPI)': verify FAIL" in out, out
    assert "walking the commits of" in out and "between v0.18.1 and v0.18.2" in out
    assert f"first bad commit: {shas['G'][:12]} '{SUBJECT_G}'" in out
    runs = runs_by_sha(home)
    assert runs.get("pypi-0.18.2") == 1 and runs.get("pypi-0.18.1") == 1 and "pypi-0.18.0" not in runs, runs
    recs = records(home)
    assert recs["pypi-0.18.2"]["version"].startswith("0.18.2") and recs["pypi-0.18.1"]["build"] == "ok"
    walk_dir = session(home, "0.18.0-0.18.2-verdict")
    progress = json.loads((walk_dir / "progress.json").read_text())
    assert progress["noun"] == "release" and progress["first_bad"] == "pypi-0.18.2"
    assert [(p["name"], p["verdict"]) for p in progress["path"]] == [("0.18.2", "bad"), ("0.18.1", "good")]
    report = (walk_dir / "report.md").read_text()
    assert "over releases" in report and "`0.18.2` bad -> `0.18.1` good" in report
    commits = session(home, f"{shas['B'][:10]}-{shas['D'][:10]}-verdict")
    assert "narrowed by the release walk: last good release 0.18.1" in (commits / "report.md").read_text()
    first_test_ran = any((home / "runs" / "bisect").glob(f"*/{shas['A'][:10]}-{shas['D'][:10]}-verdict"))
    if first_test_ran:  # the commit walk reused every verdict of test 1: its 4 runs, none more
        assert sum(n for s, n in runs.items() if not s.startswith("pypi-")) == 4


@pytest.mark.timeout(3600)
def test_the_loss_misses_what_the_verdict_catches(bench: dict) -> None:
    """The same runs (nothing new runs after test 1): loss names C, the gradient-norm ratio G; A..B: none."""
    shas, home = bench["shas"], bench["home"]
    before = runs_by_sha(home)
    loss = run_bisect(bench, bisect_argv(bench, shas["B"], shas["D"], *with_repo(bench), metric="loss"))
    assert loss.returncode == 0, loss.stdout + loss.stderr
    assert f"first bad commit: {shas['C'][:12]} '{SUBJECT_C}'" in loss.stdout, loss.stdout
    progress = json.loads((session(home, "*-loss") / "progress.json").read_text())
    g_row = next(t for t in progress["tested"] if t["sha"] == shas["G"])
    assert g_row["verdict"] == "good" and "max |loss difference|" in g_row["change"], g_row

    ratio = run_bisect(bench, bisect_argv(bench, shas["B"], shas["D"], *with_repo(bench),
                                          "--threshold", "0.5", metric="grad_norm/grad_norm_baseline"))  # fmt: skip
    assert ratio.returncode == 0, ratio.stdout + ratio.stderr
    assert f"first bad commit: {shas['G'][:12]}" in ratio.stdout and "grad_norm/grad_norm_baseline" in ratio.stdout

    none = run_bisect(bench, bisect_argv(bench, shas["A"], shas["B"], *with_repo(bench)))
    assert none.returncode == 0 and "no regression found" in none.stdout, none.stdout + none.stderr
    if before:  # after test 1: every result reused, nothing built or run again
        assert runs_by_sha(home) == before
