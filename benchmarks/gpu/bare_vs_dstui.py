#!/usr/bin/env python
"""A bare DeepSpeed script against `dstui run` of the same training, interleaved (issue 31, item 2).

Each round runs, in alternating order:

* bare: benchmarks/gpu/bare_ds.py (plain torch + transformers + DeepSpeed, no
  dstui), one rank started by hand, model built under ``torch.device("cuda")``,
  with exactly the ds_config dstui generates for the spec below;
* dstui: ``python -m dstui run SPEC --quiet`` of a one-run spec (same model,
  ZeRO stage, dtype, micro batch, sequence length, steps, seed, synthetic
  tokens), in one DSTUI_HOME kept across rounds (a user's home already has its
  MLflow store).

With ``--before-tree DIR`` a third contender, ``dstui_before``: the same
`dstui run` from an older source tree (``git archive OLD dstui runners configs
pyproject.toml | tar -x -C DIR``), interleaved with the other two: the phase
breakdown before and after a change, in one call.

All get the same bytecode cache (``PYTHONPYCACHEPREFIX``, which dstui honours
as the user's own) and the same JIT-op folder; ``--warmup`` runs one of each
uncounted first, so every counted launch finds warm caches.

Measured per launch (unix times; the harness notes when it starts the command):

* launch -> first step: the harness's start of the command to the rank's
  ``first_step_done`` mark (for dstui also from the supervisor's rank launch);
* launch -> exit: the command's wall time;
* dstui's own time outside the run: the command's wall minus the run's wall
  (rank launch to reap): CLI, spec checks, store, supervisor start and end;
* the phase breakdown: imports, process group, model build, engine (+ data),
  first step, the other steps, teardown.

    python benchmarks/gpu/bare_vs_dstui.py --rounds 3 --warmup            # llama-1b, ZeRO-1, bf16, 4 x 2048
    python benchmarks/gpu/bare_vs_dstui.py --model tiny-llama --dtype fp32 --seq-length 64 \\
        --micro-batch 2 --steps 3 --torch-adam --rounds 2                # the same on a CPU

Prints a table on stderr and one JSON object on stdout; docs/BENCHMARKS.md has the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

# (segment, from mark, to mark): the same cuts for both programs
SEGMENTS = (
    ("imports", "process_start", "imports_done"),
    ("group", "imports_done", "group_up"),
    ("model", "group_up", "model_built"),
    ("engine", "model_built", "engine_ready"),
    ("first_step", "engine_ready", "first_step_done"),
    ("steps", "first_step_done", "last_step_done"),
    ("exit", "last_step_done", "exit"),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_spec(folder: Path, a: argparse.Namespace) -> Path:
    settings = {
        "model": a.model, "dataset": "synthetic", "seq_length": a.seq_length, "micro_batch": a.micro_batch,
        "grad_accum": 1, "steps": a.steps, "warmup_steps": max(0, min(3, a.steps - 1)), "dtype": a.dtype,
        "gpus": 1, "seed": a.seed, "zero_stage": a.zero_stage, "torch_adam": a.torch_adam, "hung_after_s": 600,
    }  # fmt: skip
    spec = folder / "bare_vs_dstui.yaml"
    spec.write_text(json.dumps({"name": "bare-vs-dstui", "settings": settings, "conditions": [{"name": "run"}]}))
    return spec


def ds_config_of(spec: Path) -> dict[str, Any]:
    """The ds_config dstui generates for the spec's one run: the bare script gets the very same."""
    from dstui.execute.batch import plan

    p = plan(spec, validate=False, resolve_revisions=False, progress=lambda _: None)
    (run,) = p.runs
    return p.ds_configs[run.name]


def model_config_file(model: str) -> Path:
    preset = REPO / "configs" / "models" / f"{model}.json"
    path = preset if preset.is_file() else Path(model) / "config.json"
    if not path.is_file():
        raise SystemExit(f"no config for model {model!r} ({path})")
    return path


def segments(marks: dict[str, float]) -> dict[str, float | None]:
    return {name: (marks[b] - marks[a]) if a in marks and b in marks else None for name, a, b in SEGMENTS}


def probed(env: dict[str, str], probe: Path | None, who: str, n: int) -> dict[str, str]:
    """``env`` with the first-step probe on (benchmarks/gpu/probe), writing under ``probe/who-n``."""
    if probe is None:
        return env
    folder = REPO / "benchmarks" / "gpu" / "probe"
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != folder]
    return {**env, "DSTUI_STEP1_PROBE": str(probe / f"{who}-{n}"), "PYTHONPATH": os.pathsep.join([str(folder), *path])}


def run_bare(a: argparse.Namespace, work: Path, env: dict[str, str], ds_file: Path, n: int,
             runner_inputs: bool = False, tag: str = "") -> dict[str, Any]:  # fmt: skip
    marks_file = work / f"bare{tag}-{n}{'-ri' if runner_inputs else ''}.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "gpu" / "bare_ds.py"),
           "--model-config", str(model_config_file(a.model)), "--ds-config", str(ds_file),
           "--seq-length", str(a.seq_length), "--micro-batch", str(a.micro_batch), "--steps", str(a.steps),
           "--seed", str(a.seed), "--marks", str(marks_file), *(["--torch-adam"] if a.torch_adam else []),
           *(["--runner-inputs"] if runner_inputs else [])]  # fmt: skip
    rank_env = {**env, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}  # fmt: skip
    t0 = time.time()
    proc = subprocess.run(cmd, env=rank_env, capture_output=True, text=True, cwd=REPO, timeout=a.timeout)
    t1 = time.time()
    if proc.returncode != 0 or not marks_file.is_file():
        raise SystemExit(f"bare script failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    got = json.loads(marks_file.read_text())
    marks = got["marks"]
    return {
        "launch_to_first_step": marks["first_step_done"] - t0,
        "launch_to_exit": t1 - t0,
        "launch": marks["process_start"] - t0,
        "segments": segments(marks),
        "losses": got["losses"],
    }


def trace_marks(path: Path, t0: float) -> dict[str, float]:
    """``who:mark`` -> seconds after the command's start, the first of each (dstui's DSTUI_TRACE file)."""
    from dstui.core import startup_trace

    out: dict[str, float] = {}
    for rec in startup_trace.read(path):
        out.setdefault(f"{rec.get('who')}:{rec['mark']}", rec["t"] - t0)
    return out


def rank_env_of_dstui(probe: Path, base: dict[str, str]) -> dict[str, str]:
    """The environment the newest probed dstui rank had (the probe's dump), secrets from ``base``.

    For the contender ``bare_denv``: the bare script in dstui's rank environment
    tells the environment's share of a gap from the runner's own.
    """
    dumps = sorted(probe.glob("dstui-*/probe-*.json"), key=lambda f: f.stat().st_mtime)
    if not dumps:
        raise SystemExit(f"--probe: no probed dstui rank under {probe} yet (the warm-up writes one)")
    env = json.loads(dumps[-1].read_text())["env"]
    return {k: base.get(k, "") if v == "<hidden>" else v for k, v in env.items() if not k.startswith("DSTUI_")}


def last_dstui_rank_cmd(home: Path) -> list[str]:
    """``PYTHON RUNNER ARGS`` of the newest dstui run (cmd.txt, after dstui's rank starter's ``--``)."""
    import shlex

    from dstui.core.rundir import list_batches

    batch = max(list_batches(home / "runs"), key=lambda b: b.path.stat().st_mtime)
    (rd,) = batch.runs()
    cmd = shlex.split((rd.path / "cmd.txt").read_text())
    return cmd[cmd.index("--") + 1 :] if "--" in cmd else cmd


def runner_marks(metrics: Path) -> tuple[dict[str, float], list[float]]:
    """(phase marks, step losses) of dstui's runner from its metrics file; no marks if it wrote none."""
    from dstui.core.record_file import read_records

    marks: dict[str, float] = {}
    losses: list[float] = []
    for rec in read_records(metrics) if metrics.is_file() else []:
        if rec.get("type") == "phases":
            marks = {k: v for k, v in rec.items() if isinstance(v, (int, float)) and k != "time"}
        elif rec.get("type") == "step" and isinstance(rec.get("loss"), (int, float)):
            losses.append(rec["loss"])
    return marks, losses


def run_runner_by_hand(a: argparse.Namespace, work: Path, env: dict[str, str], n: int) -> dict[str, Any]:
    """dstui's runner with the newest run's arguments, started as the bare script is (its environment, no dstui)."""
    python, script, *rest = last_dstui_rank_cmd(Path(env["DSTUI_HOME"]))
    metrics = work / f"hand-{n}.jsonl"
    metrics.unlink(missing_ok=True)
    at = rest.index("--metrics-file")
    rest[at + 1] = str(metrics)
    rank_env = {**env, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}  # fmt: skip
    t0 = time.time()
    proc = subprocess.run([python, script, "--local_rank=0", *rest], env=rank_env, capture_output=True, text=True,
                          cwd=work, timeout=a.timeout)  # fmt: skip
    t1 = time.time()
    marks, losses = runner_marks(metrics)
    if proc.returncode != 0 or not marks:
        raise SystemExit(f"runner by hand failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return {
        "launch_to_first_step": marks["first_step_done"] - t0,
        "launch_to_exit": t1 - t0,
        "launch": marks["process_start"] - t0,
        "segments": segments(marks),
        "losses": losses,
    }


def run_dstui(a: argparse.Namespace, spec: Path, env: dict[str, str], trace: Path) -> dict[str, Any]:
    from dstui.core.rundir import list_batches, read_json

    home = Path(env["DSTUI_HOME"])
    before = {b.path for b in list_batches(home / "runs")} if (home / "runs").is_dir() else set()
    trace.unlink(missing_ok=True)
    env = {**env, "DSTUI_TRACE": str(trace)}  # dstui's own start-up marks (an older tree writes none)
    t0 = time.time()
    # started in the work folder: `python -m` puts the working directory first on sys.path, and in
    # the checkout that would be its dstui whatever PYTHONPATH names (--before-tree)
    proc = subprocess.run([sys.executable, "-m", "dstui", "run", str(spec), "--quiet"],
                          env=env, capture_output=True, text=True, cwd=spec.parent, timeout=a.timeout)  # fmt: skip
    t1 = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"dstui run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    (batch,) = [b for b in list_batches(home / "runs") if b.path not in before]
    (rd,) = batch.runs()
    marks, losses = runner_marks(rd.metrics_file)
    st = rd.status()
    cmd_file = rd.path / "cmd.txt"
    runner = cmd_file.read_text(errors="replace").split("train.py")[0].split()[-1] if cmd_file.is_file() else None
    launched = st.get("started")
    reaped = (read_json(rd.exit_file, {}) or {}).get("ended") or st.get("ended")
    run_wall = reaped - launched if launched and reaped else None
    marks_cli = trace_marks(trace, t0)
    if launched:
        marks_cli["status:started (rank launch)"] = launched - t0
    if reaped:
        marks_cli["exit.json:ended (reaped)"] = reaped - t0
    marks_cli["harness:command exited"] = t1 - t0
    return {
        "launch_to_first_step": marks["first_step_done"] - t0,
        "launch_to_exit": t1 - t0,
        "rank_launch_to_first_step": marks["first_step_done"] - launched if launched else None,
        "before_rank_launch": launched - t0 if launched else None,  # CLI, checks, store, supervisor start
        "after_reap": t1 - reaped if reaped else None,  # supervisor end, MLflow, CLI exit
        "outside_run": (t1 - t0) - run_wall if run_wall else None,
        "launch": marks["process_start"] - launched if launched else None,
        "segments": segments(marks),
        "losses": losses,
        "runner": f"{runner}train.py" if runner else None,  # which tree's runner ran: before or after
        "trace": marks_cli,  # who:mark -> seconds after the command's start
    }


def trace_table(rows: list[dict[str, Any]]) -> list[tuple[str, float, float]]:
    """(who:mark, mean seconds after the command's start, mean gap to the mark before) in time order."""
    keys = {k for r in rows for k in r.get("trace") or {}}
    means = sorted((statistics.fmean(r["trace"][k] for r in rows if k in r.get("trace", {})), k) for k in keys)
    out, prev = [], 0.0
    for t, k in means:
        out.append((k, t, t - prev))
        prev = t
    return out


def mean(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.fmean(vals) if vals else None


def seg_mean(rows: list[dict[str, Any]], seg: str) -> float | None:
    vals = [r["segments"][seg] for r in rows if r["segments"].get(seg) is not None]
    return statistics.fmean(vals) if vals else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=os.environ.get("MODEL", "llama-1b"), help="a preset or a config folder")
    p.add_argument("--zero-stage", type=int, default=1)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--seq-length", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--torch-adam", action="store_true", help="torch's AdamW in both (no JIT-built FusedAdam; CPU)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", action="store_true", help="one uncounted launch of each first (caches)")
    p.add_argument("--deadline", type=float, default=None, help="unix time: start no round that may not end by then")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--work", type=Path, default=None, help="keep homes and marks here (default: a temp folder)")
    p.add_argument("--dstui-tree", type=Path, default=None,
                   help="run `dstui run` from this source tree (PYTHONPATH; e.g. `git archive` of an older commit)")
    p.add_argument("--before-tree", type=Path, default=None,
                   help="a third contender, interleaved with the others: `dstui run` from this older source tree "
                        "(dstui/, runners/, configs/, pyproject.toml of the commit before the change)")  # fmt: skip
    p.add_argument("--bare-runner-inputs", action="store_true",
                   help="a third contender: the bare script fed as dstui's runner feeds its model "
                        "(labels a copy, explicit position ids)")  # fmt: skip
    p.add_argument("--probe", type=Path, default=None,
                   help="probe every rank's first step (benchmarks/gpu/probe: pending GPU work, forward/backward/"
                        "step, torch.profiler tables, switches, environment) into this folder, and add two "
                        "contenders: bare_denv (the bare script in dstui's rank environment) and hand (dstui's "
                        "runner started as the bare script is)")  # fmt: skip
    p.add_argument("--skip", action="append", default=[], metavar="WHO",
                   help="leave out a contender other than bare and dstui (e.g. bare_denv); repeatable")  # fmt: skip
    a = p.parse_args()

    work = a.work or Path(tempfile.mkdtemp(prefix="bare-vs-dstui-"))
    work.mkdir(parents=True, exist_ok=True)
    spec = write_spec(work, a)
    ds_file = work / "ds_config.json"
    ds_file.write_text(json.dumps(ds_config_of(spec)))
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "DSTUI_RUNS_DIR", "DSTUI_TRACE")}
    env.setdefault("PYTHONPYCACHEPREFIX", str(work / "pycache"))  # the same bytecode cache for both
    # ... that is written: with PYTHONDONTWRITEBYTECODE (the GPU image sets it) Python writes no
    # bytecode even under a prefix, and with a prefix it reads none from __pycache__ either, so
    # every process compiled torch, transformers, DeepSpeed and mlflow from source (what dstui's
    # own cache avoids by dropping the variable: dstui/execute/bytecode.py)
    no_write = env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(work / "torch_extensions"))  # and the same JIT-op builds
    env["DSTUI_HOME"] = str(work / "home")
    Path(env["DSTUI_HOME"]).mkdir(exist_ok=True)

    def say(msg: str) -> None:
        print(f"[bare_vs_dstui {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    say(f"bytecode cache {env['PYTHONPYCACHEPREFIX']}" + (" (PYTHONDONTWRITEBYTECODE dropped)" if no_write else ""))

    def tree_env(tree: Path | None) -> dict[str, str]:
        out = dict(env)
        if tree:
            out["PYTHONPATH"] = os.pathsep.join([str(tree.resolve()), *filter(None, [env.get("PYTHONPATH")])])
        return out

    # who -> how to run it once; "dstui_before": the same `dstui run` from an older source tree
    pr = a.probe.resolve() if a.probe else None
    contenders = {
        "bare": lambda n: run_bare(a, work, probed(env, pr, "bare", n), ds_file, n),
        "dstui": lambda n: run_dstui(a, spec, probed(tree_env(a.dstui_tree), pr, "dstui", n),
                                     work / f"trace-dstui-{n}.jsonl"),  # fmt: skip
    }
    if pr:  # is a first-step gap in the rank's environment or in the runner?
        contenders["bare_denv"] = lambda n: run_bare(
            a, work, probed(rank_env_of_dstui(pr, env), pr, "bare_denv", n), ds_file, n, tag="-denv"
        )
        contenders["hand"] = lambda n: run_runner_by_hand(a, work, probed(env, pr, "hand", n), n)
    if a.bare_runner_inputs:  # is the rank's first-step gap in what it feeds the model?
        contenders["bare_ri"] = lambda n: run_bare(a, work, env, ds_file, n, runner_inputs=True)
    if a.before_tree:
        contenders["dstui_before"] = lambda n: run_dstui(a, spec, tree_env(a.before_tree), work / f"trace-before-{n}.jsonl")
    for who in a.skip:
        if who not in ("bare", "dstui"):
            contenders.pop(who, None)
    if a.warmup:
        for who, go in contenders.items():
            if who in ("bare_denv", "hand"):  # the caches the others warmed are theirs too
                continue
            say(f"warm-up {who}: {go(0)['launch_to_exit']:.1f} s")
    rows: dict[str, list[dict[str, Any]]] = {who: [] for who in contenders}
    names = list(contenders)
    round_s = 0.0
    for i in range(a.rounds):
        if a.deadline and rows["bare"] and time.time() + round_s > a.deadline:
            say(f"stopping after {i} rounds: the next would pass the deadline")
            break
        t_round = time.time()
        order = names if i % 2 == 0 else names[::-1]  # interleaved: each goes first and last in turn
        for who in order:
            res = contenders[who](i + 1)
            rows[who].append(res)
            say(f"round {i + 1} {who}: launch->first step {res['launch_to_first_step']:.2f} s, "
                f"launch->exit {res['launch_to_exit']:.2f} s")  # fmt: skip
        round_s = time.time() - t_round

    if not all(rows.values()):
        say("no complete round")
        return 1
    b = rows["bare"]
    cols = [name for name, _, _ in SEGMENTS]
    print(f"{'':12} {'->1st step':>10} {'->exit':>8} {'outside':>8} " + " ".join(f"{c:>10}" for c in cols),
          file=sys.stderr)  # fmt: skip
    for who, rs in rows.items():
        cells = " ".join(f"{seg_mean(rs, c) or float('nan'):10.2f}" for c in cols)
        outside = mean(rs, "outside_run")
        print(f"{who:12} {mean(rs, 'launch_to_first_step'):10.2f} {mean(rs, 'launch_to_exit'):8.2f} "
              f"{outside if outside is not None else float('nan'):8.2f} {cells}", file=sys.stderr)  # fmt: skip
    for who in names[1:]:
        table = trace_table(rows[who])
        if table:
            print(f"{who}: its own marks (DSTUI_TRACE), mean seconds after the command's start (+ gap to the mark "
                  "before); the rank's own phases follow its launch", file=sys.stderr)  # fmt: skip
            for k, t, gap in table:
                print(f"  {t:8.2f}  +{gap:6.2f}  {k}", file=sys.stderr)
    summary: dict[str, Any] = {}
    for who in names[1:]:
        d = rows[who]
        ratio = mean(d, "launch_to_first_step") / mean(b, "launch_to_first_step")
        rank_ratio = (mean(d, "rank_launch_to_first_step") or float("nan")) / mean(b, "launch_to_first_step")
        summary[who] = {"ratio_first_step": ratio, "ratio_first_step_from_rank_launch": rank_ratio}
        if mean(d, "outside_run") is None:  # another bare variant: no command around its rank
            print(f"{who}/bare launch->first step: {ratio:.2f}", file=sys.stderr)
            continue
        print(f"{who}/bare launch->first step: {ratio:.2f} (from the command), {rank_ratio:.2f} (from the rank "
              f"launch); outside the run {mean(d, 'outside_run'):.2f} s (before the rank launch "
              f"{mean(d, 'before_rank_launch'):.2f} s, after the reap {mean(d, 'after_reap'):.2f} s)",
              file=sys.stderr)  # fmt: skip
    print(json.dumps({"model": a.model, "zero_stage": a.zero_stage, "dtype": a.dtype, "micro_batch": a.micro_batch,
                      "seq_length": a.seq_length, "steps": a.steps, "rounds": len(b),
                      "dstui_tree": str(a.dstui_tree or REPO), "before_tree": str(a.before_tree or ""),
                      "bytecode_cache": env["PYTHONPYCACHEPREFIX"], "dropped_dontwritebytecode": bool(no_write),
                      "pyc_files": sum(1 for _ in Path(env["PYTHONPYCACHEPREFIX"]).rglob("*.pyc")),
                      "trace": {who: trace_table(rows[who]) for who in names[1:]},
                      "ratio_first_step": summary["dstui"]["ratio_first_step"], "vs_bare": summary,
                      "mean": {who: {"launch_to_first_step": mean(rs, "launch_to_first_step"),
                                     "launch_to_exit": mean(rs, "launch_to_exit"),
                                     "outside_run": mean(rs, "outside_run"),
                                     "segments": {c: seg_mean(rs, c) for c in cols}} for who, rs in rows.items()},
                      "runs": rows}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
