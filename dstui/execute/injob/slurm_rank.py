"""One rank of a Slurm job: Slurm's task variables in the names DeepSpeed reads, then exec.

``srun`` starts one task per rank and numbers them in ``SLURM_PROCID`` /
``SLURM_LOCALID``; ``deepspeed.init_distributed`` reads ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` (the job
script exports the last two). Stdlib only: it starts once per rank.

Each rank also leaves ``ranks/<rank>.json`` in the run folder (its host, node
and local rank): which ranks ran where is then a fact of the run, readable on
the shared filesystem after the job, not a guess from the node list.
Usage: srun python -m dstui.execute.injob.slurm_rank -- ARGV...
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

RANKS_DIR = "ranks"


def rank_env(env: dict[str, str]) -> dict[str, str]:
    """The torch.distributed variables of this task, from Slurm's."""
    nodes = int(env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES") or 1)
    world = int(env.get("SLURM_NTASKS") or 1)
    return {
        "RANK": env.get("SLURM_PROCID", "0"),
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "WORLD_SIZE": str(world),
        "LOCAL_SIZE": str(world // max(nodes, 1)),
        "CROSS_RANK": env.get("SLURM_NODEID", "0"),
        "CROSS_SIZE": str(nodes),
    }


def record_placement(env: dict[str, str]) -> None:
    """Write where this rank runs into ``$DSTUI_RUN_DIR/ranks/<rank>.json`` (best effort: never stops a rank)."""
    run_dir = env.get("DSTUI_RUN_DIR")
    if not run_dir:
        return
    rank = env.get("RANK", "0")
    rec = {
        "rank": int(rank),
        "local_rank": int(env.get("LOCAL_RANK", "0")),
        "node_rank": int(env.get("CROSS_RANK", "0")),
        "hostname": socket.gethostname(),
        "slurm_node": env.get("SLURMD_NODENAME", ""),
        "job_id": env.get("SLURM_JOB_ID", ""),
        "pid": os.getpid(),
    }
    try:
        folder = Path(run_dir) / RANKS_DIR
        folder.mkdir(mode=0o700, exist_ok=True)
        tmp = folder / f".{rank}.json.tmp"
        tmp.write_text(json.dumps(rec) + "\n")
        tmp.replace(folder / f"{rank}.json")
    except OSError as e:
        print(f"dstui: rank {rank}: could not record its placement: {e}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "--":
        print("usage: python -m dstui.execute.injob.slurm_rank -- ARGV...", file=sys.stderr)
        return 2
    os.environ.update(rank_env(dict(os.environ)))
    record_placement(dict(os.environ))
    from dstui.core.secrets import MissingEnvRef, resolve_env_refs  # stdlib only

    try:
        command = resolve_env_refs(argv[1:], os.environ)  # {env:NAME}: job.sh names it, the rank gets it
    except MissingEnvRef as e:
        print(f"dstui: cannot start the rank: {e}", file=sys.stderr, flush=True)
        return 127
    try:
        os.execvp(command[0], command)
    except OSError as e:
        print(f"dstui: cannot start {argv[1]!r} on {os.uname().nodename}: {e}", file=sys.stderr, flush=True)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
