"""`dstui list SPEC`: the expanded runs, one line each. Nothing is launched."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import textwrap
from pathlib import Path

from dstui.analysis import forecast, time_forecast
from dstui.commands._common import fitted_table
from dstui.commands._machine import emit
from dstui.commands._records import plan_record
from dstui.commands._tables import terminal_width
from dstui.core.rundir import RunDir
from dstui.execute import backends, batch, feasibility, launch, sysmetrics


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="experiment spec (YAML), e.g. configs/experiments/smoke.yaml")
    p.add_argument(
        "--no-validate",
        action="store_true",
        help="skip DeepSpeed's config validation (faster; the spec itself is still checked)",
    )
    p.add_argument("--only", nargs="+", metavar="PATTERN", help="list only these runs or conditions (shell patterns)")
    p.add_argument("--commands", action="store_true", help="also print each run's exact argv")
    p.add_argument("--json", action="store_true", help="print the runs as one JSON document (nothing launched)")
    p.add_argument(
        "--no-history",
        action="store_true",
        help="forecast memory and step time from first principles only (skip reading earlier runs from MLflow)",
    )


def run(args: argparse.Namespace) -> int:
    p = batch.plan(args.spec, validate=not args.no_validate, resolve_revisions=False, only=args.only)
    forecasts, capacity = forecast.for_plan(p, sysmetrics.gpu_memory_total(), history=not args.no_history)
    gpus = sysmetrics.gpu_count()
    model = time_forecast.for_machine("cuda" if gpus else "cpu", sysmetrics.gpu_name() if gpus else None,
                                      use_history=not args.no_history)  # fmt: skip
    steps = time_forecast.predict_runs(p.runs, model)
    # the same check `dstui run` refuses with: a list that says "valid" must also say what cannot run here
    machine = backends.get(p.spec.executor).capacity()  # None: a scheduler places the runs and judges them
    infeasible = feasibility.problems(p.runs, machine, forecasts=forecasts, capacity=capacity)
    if args.json:
        return print_json(p, forecasts, capacity, commands=args.commands, validated=not args.no_validate,
                          infeasible=infeasible, steps=steps)  # fmt: skip
    rows = []
    for r in p.runs:
        s = r.settings
        row = [
            str(r.order), r.name, r.revision, s.kind, s.model, f"z{s.zero_stage}",
            s.offload if s.offload_params == "none" else f"{s.offload}/{s.offload_params}",
            "dc" if s.deepcompile else ("tc" if s.compile else "-"), s.dtype,
            str(s.micro_batch), str(s.seq_length), str(s.grad_accum), str(s.gpus * s.nodes),
            str(s.steps), forecast.column(forecasts.get(r.name), capacity), time_forecast.column(steps.get(r.name)), r.key,
        ]  # fmt: skip
        if s.kind == "command":
            # dstui runs the user's command as it is: the training settings are its own, unknown here
            row[4:12] = ["-"] * 8  # the step-time cell is '-' already: no prediction for a command
        rows.append(row)
    header = ["#", "run", "revision", "kind", "model", "zero", "offload", "compile", "dtype",
              "mb", "seq", "ga", "ranks", "steps", "mem/GPU", "step", "key"]  # fmt: skip
    # the key goes first at 80 columns (it names the run's cache entry, not what it runs), then the
    # settings a glance needs least
    width = terminal_width()
    print(fitted_table(rows, header, width, drop_first=("key", "revision", "kind", "ga", "steps", "offload")))
    checked = "the spec and each run's ds_config" if not args.no_validate else "the spec (ds_configs not: --no-validate)"
    print(f"\n{len(p.runs)} runs ({p.spec.name}); {checked} valid")
    if infeasible and machine is not None:
        print(textwrap.fill(f"{len(infeasible)} cannot work on this machine ({machine.describe()}); `dstui run` "
                            "refuses them (--force launches anyway):", width=width))  # fmt: skip
        for problem in infeasible:
            print(textwrap.fill(problem.line(), width=width, initial_indent="  ", subsequent_indent="      "))
    elif machine is not None:
        print(f"all can work on this machine ({machine.describe()})")
    print(textwrap.fill(forecast.capacity_note(capacity), width=width))
    print(textwrap.fill(f"step: predicted time per optimizer step ({model.source}, "
                        f"{time_forecast.machine_words(model.hardware)})", width=width))  # fmt: skip
    if args.commands:
        for r in p.runs:
            rd = RunDir(Path("runs/<batch>") / r.name)
            print(shlex.join(launch.shown_command(r, launch.build_argv(r, rd))))
    return 0


def print_json(
    p: batch.Plan, forecasts: dict, capacity: int | None, *, commands: bool, validated: bool,
    infeasible: list[feasibility.Infeasible], steps: dict | None = None,
) -> int:  # fmt: skip
    """`--json`: the plan as one document; every run ``planned`` at step 0 (see _records.plan_record)."""
    runs = []
    for r in p.runs:
        argv = launch.build_argv(r, RunDir(Path("runs/<batch>") / r.name)) if commands else None
        runs.append(plan_record(r, forecasts.get(r.name), capacity, command=argv, step=(steps or {}).get(r.name)))
    emit({"experiment": p.spec.name, "spec": str(p.spec_path), "validated": validated,
          "gpu_memory": capacity, "runs": runs,
          "cannot_work_here": [dataclasses.asdict(f) for f in infeasible]})  # fmt: skip
    return 0
