"""`dstui list SPEC`: the expanded runs, one line each. Nothing is launched."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import textwrap
from pathlib import Path

from dstui.analysis import forecast
from dstui.commands._common import fitted_table
from dstui.commands._machine import emit
from dstui.commands._records import plan_record
from dstui.commands._tables import terminal_width
from dstui.usecases import launch, step_forecast, varying_settings
from dstui.usecases.options import LaunchOptions

LISTED = Path("runs/<batch>")  # where the listed runs' folders are shown to be


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
    options = LaunchOptions(validate=not args.no_validate, only=args.only, history=not args.no_history)
    # the checks `dstui run` refuses by, only found: a list that says "valid" must also say what cannot run here
    prepared = launch.prepare(args.spec, options, refuse=False, resolve_revisions=False)
    forecasts, capacity, infeasible = prepared.forecasts, prepared.capacity, prepared.problems
    steps = step_forecast.predict(prepared.runs, history=not args.no_history)
    if args.json:
        return print_json(prepared, steps, commands=args.commands, validated=not args.no_validate)
    extra = varying_settings.varying(prepared.runs)  # an axis over any other setting (lr) gets a column too
    rows = []
    for r in prepared.runs:
        s = r.settings
        row = [
            str(r.order), r.name, r.revision, s.kind, s.model, f"z{s.zero_stage}",
            s.offload if s.offload_params == "none" else f"{s.offload}/{s.offload_params}",
            "dc" if s.deepcompile else ("tc" if s.compile else "-"), s.dtype,
            str(s.micro_batch), str(s.seq_length), str(s.grad_accum), str(s.gpus * s.nodes),
            str(s.steps), forecast.column(forecasts.get(r.name), capacity), step_forecast.column(steps.predictions.get(r.name)), r.key,
        ]  # fmt: skip
        if s.kind == "command":
            # dstui runs the user's command as it is: the training settings are its own, unknown here
            row[4:12] = ["-"] * 8  # the step-time cell is '-' already: no prediction for a command
        row[2:2] = [varying_settings.value_text(getattr(s, name)) for name in extra]
        rows.append(row)
    header = ["#", "run", *extra, "revision", "kind", "model", "zero", "offload", "compile", "dtype",
              "mb", "seq", "ga", "ranks", "steps", "mem/GPU", "step", "key"]  # fmt: skip
    # the key goes first at 80 columns (it names the run's cache entry, not what it runs), then the
    # settings a glance needs least
    width = terminal_width()
    print(fitted_table(rows, header, width, drop_first=("key", "revision", "kind", "ga", "steps", "offload")))
    checked = "the spec and each run's ds_config" if not args.no_validate else "the spec (ds_configs not: --no-validate)"
    print(f"\n{len(prepared.runs)} runs ({prepared.spec.name}); {checked} valid")
    if infeasible and prepared.machine is not None:
        print(textwrap.fill(f"{len(infeasible)} cannot work on this machine ({prepared.machine}); `dstui run` "
                            "refuses them (--force launches anyway):", width=width))  # fmt: skip
        for problem in infeasible:
            print(textwrap.fill(problem.line(), width=width, initial_indent="  ", subsequent_indent="      "))
    elif prepared.machine is not None:  # None: a scheduler places the runs and judges them
        print(f"all can work on this machine ({prepared.machine})")
    print(textwrap.fill(forecast.capacity_note(capacity), width=width))
    print(textwrap.fill(steps.note, width=width))
    if args.commands:
        for _, argv in launch.commands(prepared.plan, root=LISTED, with_python=False):
            print(shlex.join(argv))
    return 0


def print_json(prepared: launch.Prepared, steps: step_forecast.StepForecast, *, commands: bool, validated: bool) -> int:
    """`--json`: the plan as one document; every run ``planned`` at step 0 (see _records.plan_record)."""
    shown = launch.commands(prepared.plan, root=LISTED, with_python=False, shown=False) if commands else []
    argvs = {r.name: argv for r, argv in shown}
    extra = varying_settings.varying(prepared.runs)
    runs = [plan_record(r, prepared.forecasts.get(r.name), prepared.capacity, command=argvs.get(r.name),
                        step=steps.predictions.get(r.name), extra=varying_settings.values(r, extra))
            for r in prepared.runs]  # fmt: skip
    emit({"experiment": prepared.spec.name, "spec": str(prepared.plan.spec_path), "validated": validated,
          "gpu_memory": prepared.capacity, "runs": runs,
          "cannot_work_here": [dataclasses.asdict(f) for f in prepared.problems]})  # fmt: skip
    return 0
