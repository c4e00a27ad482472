"""Re-run one finished 1-rank run under cProfile to see where its start-up goes (issue 12).

The run's own command (``cmd.txt``: dstui's rank starter, then the runner) is
replayed with this script standing in for the runner (``--rank-wrapper``): it
calls the runner's ``main()`` under cProfile and dumps the profile before the
runner's hard exit. The metrics go to a scratch file, so the run folder stays
as it was; the environment gets the caches dstui gives a run (compile caches,
bytecode), so a replay of a repeat is profiled as a repeat. Prints the phase record
of the replay and the functions with the most cumulative and own time.

    python benchmarks/gpu/profile_run.py <runs/batch/run-folder> --out prof/ [--steps 2]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

WRAPPER = "--rank-wrapper"


def as_rank() -> int:
    """In a rank: ``[--local_rank=N] --rank-wrapper RUNNER ARGS`` -> the runner's main() under cProfile."""
    at = sys.argv.index(WRAPPER)
    script = sys.argv[at + 1]
    sys.argv = [script, *sys.argv[1:at], *sys.argv[at + 2 :]]
    sys.path.insert(0, str(Path(script).parent))
    module = runpy.run_path(script, run_name="profiled_runner")
    profile = cProfile.Profile()
    code = profile.runcall(module["main"])
    profile.dump_stats(f"{os.environ['DSTUI_PROFILE_OUT']}.rank{os.environ.get('RANK', '0')}")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as the runner's exit_now: no interpreter teardown


def run_env() -> dict[str, str]:
    """What dstui adds to a run's environment (revision-less run): compile caches, bytecode cache.

    Without these the replay would compile into torch's default caches, i.e.
    profile a first compile where the run it replays was a repeat.
    """
    from dstui.execute import bytecode, launch

    env = dict(os.environ)
    for name, folder in launch.compile_cache_dirs(None).items():
        env.setdefault(name, folder)
    return bytecode.apply(env)


def replay_argv(cmd: list[str], metrics: Path, steps: int | None) -> list[str]:
    """The run's argv with this script standing in for the runner and its metrics file replaced."""
    out: list[str] = []
    it = iter(range(len(cmd)))
    for i in it:
        arg = cmd[i]
        if arg.endswith(".py") and Path(arg).name in {"train.py", "compare_loss.py"}:
            out += [str(Path(__file__).resolve()), WRAPPER, arg]
        elif arg == "--metrics-file":
            out += [arg, str(metrics)]
            next(it)
        elif arg == "--steps" and steps is not None:
            out += [arg, str(steps)]
            next(it)
        elif arg == "--warmup-steps" and steps is not None:
            out += [arg, str(max(0, min(int(cmd[i + 1]), steps - 1)))]  # the runner wants it below steps
            next(it)
        else:
            out.append(arg)
    return out


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("run", type=Path, help="a finished run folder (has cmd.txt)")
    p.add_argument(
        "--out", type=Path, required=True, help="folder for the profile and the replay's metrics"
    )
    p.add_argument(
        "--steps", type=int, default=None, help="train this many steps instead of the run's"
    )
    p.add_argument("--top", type=int, default=40)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cmd = shlex.split((args.run / "cmd.txt").read_text())
    prof, metrics = args.out / f"{args.run.name}.prof", args.out / f"{args.run.name}.metrics.jsonl"
    metrics.unlink(missing_ok=True)
    argv = replay_argv(cmd, metrics, args.steps)
    print(" ".join(shlex.quote(a) for a in argv), flush=True)
    code = subprocess.call(argv, env={**run_env(), "DSTUI_PROFILE_OUT": str(prof)})
    prof = prof.with_name(prof.name + ".rank0")
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        rec = json.loads(line)
        if rec.get("type") == "phases":
            t0 = rec["process_start"]
            print(
                "phases:",
                {
                    k: round(v - t0, 2)
                    for k, v in rec.items()
                    if isinstance(v, float) and k != "time"
                },
            )
    if prof.exists():
        stats = pstats.Stats(str(prof), stream=sys.stdout)
        stats.sort_stats("cumulative").print_stats(args.top)
        stats.sort_stats("tottime").print_stats(args.top // 2)
    return code


if __name__ == "__main__":
    sys.exit(as_rank() if WRAPPER in sys.argv else main())
