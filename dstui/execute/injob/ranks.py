"""Start the ranks of a single-node job directly, with the environment DeepSpeed's launcher gives them.

``python -m deepspeed.launcher.runner`` imports DeepSpeed, then starts
``python -m deepspeed.launcher.launch``, which imports it again, and only
then are the ranks started (which import it a third time). On a 2-core box
that is seconds per run; on a GPU host with a CUDA torch it is more. This
module does the launcher's single-node job in plain Python (no torch, no
DeepSpeed): one process per local rank, the same environment variables
(``deepspeed/launcher/launch.py``: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE,
MASTER_ADDR, MASTER_PORT, CROSS_RANK, CROSS_SIZE, the accelerator's
visible-devices variable, and the variable ``import deepspeed`` sets in the
launcher's own environment), the same
``--local_rank=N`` argument, and the same rule when a rank fails: the others
are stopped and the job exits with that rank's status. Multi-node jobs and
hostfiles keep DeepSpeed's launcher (dstui.execute.launch decides).

Usage (what dstui.execute.launch writes into a run's argv)::

    python -m dstui.execute.injob.ranks --nproc 2 --master-port 29500 [--devices 0,1] \\
        -- PYTHON SCRIPT [ARGS...]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

# What deepspeed/launcher/launch.py names CROSS_RANK/CROSS_SIZE (launcher/constants.py).
CROSS_RANK = "CROSS_RANK"
CROSS_SIZE = "CROSS_SIZE"
VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"  # what both the CUDA and the CPU accelerator set
STOP_GRACE_S = 10.0


def rank_env(
    base: dict[str, str],
    *,
    rank: int,
    nproc: int,
    master_addr: str,
    master_port: int,
    devices: list[int],
) -> dict[str, str]:
    """The environment DeepSpeed's single-node launch gives local rank ``rank`` of ``nproc``."""
    env = dict(base)
    # deepspeed/__init__.py sets this in the launcher, whose environment the ranks inherit.
    env.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    env[VISIBLE_DEVICES] = ",".join(str(d) for d in devices)
    env.update(
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
        WORLD_SIZE=str(nproc),
        LOCAL_SIZE=str(nproc),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
    )
    env[CROSS_RANK] = "0"
    env[CROSS_SIZE] = "1"
    return env


def rank_argv(command: list[str], local_rank: int) -> list[str]:
    """``PYTHON SCRIPT ARGS`` -> ``PYTHON -u SCRIPT --local_rank=N ARGS``, as DeepSpeed's launch builds it."""
    python, script, *rest = command
    return [python, "-u", script, f"--local_rank={local_rank}", *rest]


def exit_status(returncode: int) -> int:
    """A shell-style status: a rank killed by signal N gives 128+N (DeepSpeed's launcher gives 256-N)."""
    return 128 - returncode if returncode < 0 else returncode


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run(
    command: list[str], *, nproc: int, master_addr: str, master_port: int, devices: list[int]
) -> int:
    """Start the ranks, wait for all; the first to fail stops the rest and sets the exit status."""
    from dstui.core import startup_trace
    from dstui.execute.injob.rank_output import RankOutput

    startup_trace.mark("ranks_start", "ranks")
    out = RankOutput()  # each rank's output through a pipe of its own, into the log in whole lines
    procs = []
    for r in range(nproc):
        write_end = out.pipe_for(r)
        procs.append(subprocess.Popen(
            rank_argv(command, r),
            env=rank_env(dict(os.environ), rank=r, nproc=nproc, master_addr=master_addr, master_port=master_port,
                         devices=devices),
            stdout=write_end, stderr=write_end,
        ))  # fmt: skip
        os.close(write_end)  # the rank holds it now: its end is the pipe's end
    say = out.say

    def forward(signum: int, _frame: object) -> None:
        _stop(procs)
        out.drain()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    by_pid = {p.pid: (r, p) for r, p in enumerate(procs)}
    while by_pid:
        pid, raw = os.wait()  # blocks: no polling interval added to a run's teardown
        if pid not in by_pid:
            continue
        failed = _reap(by_pid, pid, raw)
        if failed:
            failed += _reap_dead(by_pid)  # ranks that died meanwhile
            rank, code = first_failure(failed)
            for dead, _ in failed:  # its last words (a faulthandler dump) before the line that names it
                out.drain(dead)
            say(f"dstui ranks: rank {rank} failed ({_how(code)}); stopping the others")
            for other, other_code in failed:
                if other != rank:
                    say(f"dstui ranks: rank {other} also failed ({_how(other_code)})")
            _stop([p for _, p in by_pid.values()])  # reaps them too
            out.drain()
            return exit_status(code)
    out.drain()
    return 0


def _reap(by_pid: dict[int, tuple[int, subprocess.Popen]], pid: int, raw: int) -> list[tuple[int, int]]:
    """Record a reaped rank's status; [(rank, returncode)] if it failed."""
    if pid not in by_pid:
        return []
    rank, proc = by_pid.pop(pid)
    proc.returncode = os.waitstatus_to_exitcode(raw)
    return [(rank, proc.returncode)] if proc.returncode != 0 else []


def _reap_dead(by_pid: dict[int, tuple[int, subprocess.Popen]]) -> list[tuple[int, int]]:
    """Reap, without waiting, every rank that is already dead; the failed ones."""
    failed: list[tuple[int, int]] = []
    while by_pid:
        try:
            pid, raw = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if not pid:
            break
        failed += _reap(by_pid, pid, raw)
    return failed


def first_failure(failed: list[tuple[int, int]]) -> tuple[int, int]:
    """The rank whose failure caused the others', among those found dead at once.

    The kernel hands zombies back in start order, not in order of death: when
    rank 2 is killed and rank 0 has already exited 1 over the lost connection
    by the time the starter looks, rank 0 comes first. A death by a signal is
    the cause rather than the consequence (SIGABRT least: gloo and NCCL abort a
    rank whose peer vanished), so it wins; then the order of reaping.
    """

    def weight(item: tuple[int, int]) -> int:
        code = item[1]
        if code < 0:
            return 1 if -code == signal.SIGABRT else 0
        return 2

    return min(failed, key=weight)


def _how(returncode: int) -> str:
    return _signal_name(returncode) if returncode < 0 else f"exit code {returncode}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dstui.execute.injob.ranks",
        description="Start the local ranks of a single-node DeepSpeed job with the environment "
        "DeepSpeed's launcher would give them (without importing DeepSpeed twice first).",
    )
    p.add_argument("--nproc", type=int, required=True, help="ranks to start on this node")
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, required=True)
    p.add_argument(
        "--devices",
        default=None,
        help="accelerator ids, comma-separated (default 0..nproc-1, as --num_gpus does)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- PYTHON SCRIPT [ARGS...]")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if len(command) < 2:
        p.error("give the rank command after --: PYTHON SCRIPT [ARGS...]")
    if args.nproc < 1:
        p.error("--nproc must be 1 or more")
    devices = [int(d) for d in args.devices.split(",")] if args.devices else list(range(args.nproc))
    if len(devices) != args.nproc:
        p.error(f"--devices names {len(devices)} devices for {args.nproc} ranks")
    return run(
        command,
        nproc=args.nproc,
        master_addr=args.master_addr,
        master_port=args.master_port,
        devices=devices,
    )


if __name__ == "__main__":
    sys.exit(main())
