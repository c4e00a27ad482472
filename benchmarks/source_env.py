#!/usr/bin/env python
"""A commit's env: source on path against a pip build, cold and warm cache (issue 30 part 3).

A git repository is made from a DeepSpeed release sdist (commit A) plus one
commit B that adds a module (same install recipe). Each round, in a fresh env
cache:

* pip (reference, cold): A with ``install: pip``: what every commit cost before;
* source (cold): B with ``install: auto``: placed on the path, A is its reference;
* pip (cold): B with ``install: pip``: the same commit built the old way;
* source / pip (warm): B resolved again each way (``install: source`` / ``pip``): a marker read.

Every figure is the wall time of ``dstui.revisions.envs.resolve`` in this
process (a build includes the import check in the new env).

    python benchmarks/source_env.py [--release 0.18.0] [--rounds 2] [--work /tmp/dstui-source-env-bench]
    python benchmarks/source_env.py --repo PATH --reference SHA --commit SHA   # any clone: A = reference, B = commit

Prints a table and one JSON object; docs/BENCHMARKS.md records the results.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dstui.revisions import envs as R
from dstui.spec.experiment import Revision

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import deepspeed_sdists  # noqa: E402 - tests/: the sdist-as-clone helper the tests use

GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@example.com",
           "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@example.com"}  # fmt: skip


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "commit.gpgsign=false", *args],
                          capture_output=True, text=True, check=True, env=GIT_ENV).stdout.strip()  # fmt: skip


def make_repo(work: Path, release: str) -> tuple[Path, str, str]:
    """A = the release tree as a clone would have it, B = A + one module."""
    repo = work / f"repo-{release}"
    if (repo / ".git").exists():
        return repo, git(repo, "rev-parse", "HEAD~1"), git(repo, "rev-parse", "HEAD")
    deepspeed_sdists.unpack_as_clone(deepspeed_sdists.download(release, work / "sdists"), repo)
    git(repo, "init", "-q", "-b", "master")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"DeepSpeed {release}")
    (repo / "deepspeed" / "bench_probe.py").write_text("X = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "one more module")
    return repo, git(repo, "rev-parse", "HEAD~1"), git(repo, "rev-parse", "HEAD")


def timed(rev: Revision, cache: Path) -> tuple[float, str]:
    t0 = time.monotonic()
    r = R.resolve(rev, cache_dir=cache, progress=lambda s: None)
    return time.monotonic() - t0, str(r.install)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--release", default="0.18.0")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "dstui-source-env-bench")
    ap.add_argument("--repo", type=Path, help="an existing DeepSpeed clone instead of the generated one")
    ap.add_argument("--reference", help="with --repo: the commit pip-built first (A)")
    ap.add_argument("--commit", help="with --repo: the commit built both ways (B; same install recipe as A)")
    args = ap.parse_args()
    if args.repo:
        if not (args.reference and args.commit):
            ap.error("--repo needs --reference and --commit")
        repo, a, b = args.repo.resolve(), args.reference, args.commit
        args.release = f"{args.repo.name} {a[:10]} -> {b[:10]}"
    else:
        repo, a, b = make_repo(args.work, args.release)
    steps = [
        ("pip (reference), cold", Revision(name="a", git=str(repo), ref=a, install="pip"), "pip"),
        ("source, cold", Revision(name="b", git=str(repo), ref=b), "source"),
        ("pip, cold", Revision(name="bp", git=str(repo), ref=b, install="pip"), "pip"),
        # auto would now reuse B's pip env (a cached env is reused whichever way it was built)
        ("source, warm", Revision(name="b", git=str(repo), ref=b, install="source"), "source"),
        ("pip, warm", Revision(name="bp", git=str(repo), ref=b, install="pip"), "pip"),
    ]
    times: dict[str, list[float]] = {s[0]: [] for s in steps}
    loads = []
    for _ in range(args.rounds):
        cache = args.work / "cache"
        shutil.rmtree(cache, ignore_errors=True)
        for label, rev, want in steps:
            loads.append(os.getloadavg()[0])
            took, got = timed(rev, cache)
            assert got == want, (label, got)
            times[label].append(took)
    print(f"DeepSpeed {args.release}, {args.rounds} rounds, load {min(loads):.1f}-{max(loads):.1f} (1-min avg)")
    print(f"{'what':28} {'median s':>9} {'all':>20}")
    for label, ts in times.items():
        print(f"{label:28} {statistics.median(ts):9.2f} {' '.join(f'{t:.2f}' for t in ts):>20}")
    print(json.dumps({"release": args.release, "rounds": args.rounds, "load": [min(loads), max(loads)],
                      "seconds": times}))  # fmt: skip


if __name__ == "__main__":
    main()
