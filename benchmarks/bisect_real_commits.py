"""A verdict bisection over ~40 real DeepSpeed commits, timed end to end (issue 30's goal: < 10 min).

The history is real DeepSpeed: the first-parent commits between two release tags of a DeepSpeed
clone (default v0.19.3..v0.19.4, 40 commits), replayed as one linear branch in a scratch
repository with git's plumbing (no checkout). From commit ``--bug-at`` on, every tree carries a
silent gradient bug: ``DeepSpeedEngine.backward`` scales the loss by 1.001, so every gradient is
off by that factor while the loss curve moves by ~1e-4 of its value. A ``kind: verify`` batch
(DeepSpeed against plain PyTorch, exact) FAILs on those commits and PASSes before them.

    .ci/with-env python benchmarks/bisect_real_commits.py --mirror ~/DeepSpeed [--bug-at 27]

prints each line of ``dstui bisect`` as it comes, then one JSON line: the commit it named, whether
that is the injected one, how many commits were built and run, and the wall time (every env
included: the env cache starts empty unless ``--keep-cache``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

BUG = '''

# dstui benchmark: a silent gradient bug. Every gradient is 1.001x what it should be.
_dstui_original_backward = DeepSpeedEngine.backward


def _dstui_backward_scaled(self, loss, *args, **kwargs):
    return _dstui_original_backward(self, loss * 1.001, *args, **kwargs)


DeepSpeedEngine.backward = _dstui_backward_scaled
'''
ENGINE = "deepspeed/runtime/engine.py"
GIT_ENV = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.com",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.com"}  # fmt: skip


def git(repo: Path, *args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "commit.gpgsign=false", *args], input=stdin,
                          capture_output=True, text=True, check=True,
                          env={**os.environ, **GIT_ENV, **(env or {})}).stdout.strip()  # fmt: skip


def linear_history(mirror: Path, good_tag: str, bad_tag: str, bug_at: int, out: Path) -> list[dict[str, str]]:
    """Replay ``good_tag`` and the first-parent commits up to ``bad_tag`` as one branch in ``out``.

    Returns one entry per new commit (its sha, the original sha and subject, buggy or not).
    """
    git(out.parent, "clone", "-q", "--bare", "--shared", str(mirror), out.name)
    originals = [git(out, "rev-parse", f"{good_tag}^{{commit}}")]
    originals += git(out, "rev-list", "--first-parent", "--reverse", f"{good_tag}..{bad_tag}").split()
    if not 0 < bug_at < len(originals):
        raise SystemExit(f"--bug-at must be within 1..{len(originals) - 1} ({len(originals)} commits)")
    index = out / "bench-index"
    history: list[dict[str, str]] = []
    parent = None
    for i, sha in enumerate(originals):
        env = {"GIT_INDEX_FILE": str(index), "GIT_AUTHOR_DATE": f"{1750000000 + i * 3600} +0000",
               "GIT_COMMITTER_DATE": f"{1750000000 + i * 3600} +0000"}  # fmt: skip
        git(out, "read-tree", sha, env=env)
        buggy = i >= bug_at
        if buggy:
            blob = git(out, "hash-object", "-w", "--stdin", stdin=git(out, "show", f"{sha}:{ENGINE}") + "\n" + BUG)
            git(out, "update-index", "--cacheinfo", f"100644,{blob},{ENGINE}", env=env)
        tree = git(out, "write-tree", env=env)
        subject = git(out, "log", "-1", "--format=%s", sha)
        if i == bug_at:
            subject = f"{subject} [+ injected gradient bug]"
        new = git(out, "commit-tree", tree, *(["-p", parent] if parent else []), "-m", subject, env=env)
        history.append({"sha": new, "original": sha, "subject": subject, "buggy": str(buggy)})
        parent = new
    git(out, "update-ref", "refs/heads/master", parent)
    index.unlink(missing_ok=True)
    return history


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mirror", type=Path, required=True, help="a DeepSpeed clone (only read)")
    p.add_argument("--good-tag", default="v0.19.3")
    p.add_argument("--bad-tag", default="v0.19.4")
    p.add_argument("--bug-at", type=int, default=27, help="index of the first buggy commit (0 = good tag)")
    p.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temp folder)")
    p.add_argument("--keep-cache", action="store_true", help="reuse the env cache of an earlier run in --work")
    p.add_argument("--metric", default="verdict")
    a = p.parse_args()

    work = a.work or Path(tempfile.mkdtemp(prefix="bisect-real-"))
    work.mkdir(parents=True, exist_ok=True)
    repo = work / "ds-history.git"
    shutil.rmtree(repo, ignore_errors=True)
    t_hist = time.monotonic()
    history = linear_history(a.mirror.resolve(), a.good_tag, a.bad_tag, a.bug_at, repo)
    hist_s = time.monotonic() - t_hist
    home = work / "home"
    if not a.keep_cache:
        shutil.rmtree(home, ignore_errors=True)
    home.mkdir(exist_ok=True)
    spec = work / "verify.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "bisect-real",
        "settings": {"kind": "verify", "model": "tiny-llama", "seq_length": 32, "micro_batch": 2, "steps": 3,
                     "warmup_steps": 1, "dtype": "fp32", "torch_adam": True, "rtol": 0.0, "atol": 0.0,
                     "gpus": 2, "zero_stage": 2, "hung_after_s": 600,
                     "ds_overrides": {"gradient_clipping": 0.0}},
        "conditions": [{"name": "z2"}],
    }))  # fmt: skip
    env = {**os.environ, "DSTUI_HOME": str(home), "DSTUI_CACHE": str(home / "cache"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{home}/mlflow.db"}  # fmt: skip
    env.pop("DSTUI_RUNS_DIR", None)
    argv = [sys.executable, "-m", "dstui", "bisect", str(spec), "--condition", "z2", "--repo", str(repo),
            "--good", history[0]["sha"], "--bad", history[-1]["sha"], "--metric", a.metric]  # fmt: skip
    print(f"[bench] {len(history)} commits ({a.good_tag}..{a.bad_tag}), bug from #{a.bug_at} "
          f"{history[a.bug_at]['sha'][:12]} (history built in {hist_s:.1f} s)", file=sys.stderr, flush=True)  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        print(f"[{time.monotonic() - t0:6.1f}s] {line}", end="", file=sys.stderr, flush=True)
    rc = proc.wait()
    took = time.monotonic() - t0
    named = next((ln.split("first bad commit:", 1)[1].split()[0] for ln in lines if "first bad commit:" in ln), None)
    want = history[a.bug_at]["sha"]
    records = list((home / "runs" / "bisect").glob("*/commits/*.json"))
    built = sum(1 for r in records if json.loads(r.read_text()).get("build"))
    print(json.dumps({"commits": len(history), "bug_at": a.bug_at, "injected": want, "named": named,
                      "correct": bool(named) and want.startswith(named), "rc": rc, "wall_s": round(took, 1),
                      "built": built, "metric": a.metric}))  # fmt: skip
    return 0 if rc == 0 and named and want.startswith(named) else 1


if __name__ == "__main__":
    sys.exit(main())
