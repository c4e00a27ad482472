"""System readings of one node of a Slurm job, written where the supervisor reads them.

For a local run the supervisor samples the machine it runs on. A Slurm job's
processes are on its nodes, so the job script starts this sampler once per node
(``srun --overlap --ntasks-per-node=1``, beside the ranks); each writes
``nodes/<node>.jsonl`` in the run folder (the shared filesystem), one record
per interval in the format of :func:`dstui.execute.sysmetrics.sample`: host
CPU and memory, the node's ranks (their pids from ``ranks/*.json``) and its
GPUs. It stops when the job's wrapper writes ``exit.json`` (or when Slurm ends
the job's steps). The supervisor copies these files into ``system.jsonl``
(:mod:`dstui.execute.backends.slurm_nodes`).

Usage (from job.sh): python -m dstui.execute.injob.node_sampler RUN_DIR [--interval S]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

NODES_DIR = "nodes"
EXIT_FILE = "exit.json"  # dstui.core.rundir's name; not imported: this starts on every node
_SAFE_NODE = re.compile(r"[^A-Za-z0-9._-]")


def node_label(name: str) -> str:
    """A node name fit for a file name and an MLflow key (letters, digits, ``._-``; at most 64)."""
    return _SAFE_NODE.sub("_", name)[:64] or "node"


def this_node() -> str:
    return node_label(os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0])


def rank_pids(run_dir: Path, node: str) -> list[int]:
    """The pids of this node's ranks, as each rank recorded them (dstui.execute.injob.slurm_rank)."""
    pids = []
    for f in (run_dir / "ranks").glob("*.json"):
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and node_label(str(rec.get("slurm_node") or rec.get("hostname") or "")) == node:
            with contextlib.suppress(TypeError, ValueError):
                pids.append(int(rec["pid"]))
    return pids


class RanksSampler:
    """CPU% and RSS of this node's ranks and their children: one ProcessTreeSampler per rank pid."""

    def __init__(self, run_dir: Path, node: str) -> None:
        self.run_dir, self.node = run_dir, node
        self.trees: dict[int, Any] = {}

    def sample(self) -> dict[str, float]:
        from dstui.execute.sysmetrics import ProcessTreeSampler

        for pid in rank_pids(self.run_dir, self.node):
            self.trees.setdefault(pid, ProcessTreeSampler(pid))
        total: dict[str, float] = {}
        for tree in self.trees.values():
            for k, v in tree.sample().items():
                total[k] = total.get(k, 0.0) + v
        return total


def run_sampler(run_dir: Path, interval_s: float) -> int:
    """Sample this node until the job's exit.json appears (or a signal ends the step)."""
    from dstui.execute import sysmetrics

    node = this_node()
    folder = run_dir / NODES_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    out = folder / f"{node}.jsonl"
    started = time.time()
    stop = False

    def _stop(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    ranks = RanksSampler(run_dir, node)
    sysmetrics.host_readings()  # psutil's first cpu_percent is 0.0: start its interval now
    while True:
        time.sleep(interval_s)
        rec = {"time": time.time(), "node": node, **sysmetrics.host_readings(), **ranks.sample(), **sysmetrics.gpu_readings()}
        with open(out, "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        ended = run_dir / EXIT_FILE
        with contextlib.suppress(OSError):
            if ended.stat().st_mtime >= started:
                return 0
        if stop:
            return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m dstui.execute.injob.node_sampler")
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--interval", type=float, default=2.0)
    args = ap.parse_args(argv)
    return run_sampler(args.run_dir, max(0.2, args.interval))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
