"""Command line: `dstui` opens the TUI; `dstui <command>` does the same work headless.

Commands live in :mod:`dstui.commands`, one module each with
``add_arguments(parser)`` and ``run(args) -> int``. Only the chosen command's
module is imported, so `dstui status` does not pay for pandas or mlflow.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from dstui import __version__
from dstui.commands import _machine
from dstui.core import exit_codes, home_check, library_logs, quick_exit, secrets, terminal
from dstui.core.errors import DstuiError, NotFound
from dstui.execute import bytecode

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "tui": ("dstui.commands.tui", "open the terminal UI (the default)"),
    "demo": ("dstui.commands.demo", "launch the smoke spec and watch it live in the TUI"),
    "list": ("dstui.commands.list_runs", "expand a spec into its runs (nothing is launched)"),
    "run": ("dstui.commands.run", "validate a spec, launch its runs, follow them, track in MLflow"),
    "status": ("dstui.commands.status", "show batches and runs from their folders"),
    "cancel": ("dstui.commands.cancel", "cancel runs or whole batches (kills their process groups)"),
    "retry": ("dstui.commands.retry", "queue failed, killed or skipped runs again (a batch's: retry BATCH --failed; done ones: --force)"),
    "report": ("dstui.commands.report", "export a markdown report with charts from MLflow"),
    "import": ("dstui.commands.import_", "import seed-format logs into MLflow"),
    "compare": ("dstui.commands.compare", "compare DeepSpeed revisions against a baseline"),
    "bisect": ("dstui.commands.bisect", "find the DeepSpeed commit that changed a metric"),
    "tune": ("dstui.commands.tune", "find the fastest DeepSpeed configuration of a spec's tune space that fits"),
    "ui": ("dstui.commands.ui", "print (or start) the `mlflow ui` command for these runs"),
    "supervise": ("dstui.commands.supervise", argparse.SUPPRESS),
}
# Commands whose process ends without Python's module teardown once their work is done (core.quick_exit):
# a batch's supervisor holds MLflow, SQLAlchemy and pandas, and their teardown was a fifth of its CPU.
ENDS_QUICKLY = {"supervise"}

EPILOG = """\
examples:
  dstui                                        open the TUI
  dstui demo                                   a real tiny DeepSpeed batch, watched live
  dstui list configs/experiments/smoke.yaml    the expanded runs, nothing launched
  dstui run  configs/experiments/smoke.yaml    launch, follow, track in MLflow
  dstui status                                 what is running / done / failed
  dstui report --experiment smoke -o report/   markdown report with charts
  dstui status --json                          the same as one JSON document (--jsonl: a line each)
  dstui cancel smoke-20261121-101500           every run of a batch (patterns: 'smoke-*', 'smoke-*/z3-*')

where runs live (the runs home, first match): $DSTUI_HOME; else the nearest folder,
from the current one up, whose runs/ holds a batch; else ~/.local/share/dstui
($XDG_DATA_HOME/dstui). Run folders are <home>/runs, the MLflow SQLite store
<home>/mlruns beside them (MLFLOW_TRACKING_URI for a team server), library
warnings <home>/logs/libraries.log (-v shows them too). `dstui status` says which.

""" + exit_codes.HELP


def build_parser(load: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dstui",
        description="Compose, launch, watch, track and report DeepSpeed experiments.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"dstui {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        kwargs = {} if help_text == argparse.SUPPRESS else {"help": help_text, "description": help_text}
        p = sub.add_parser(name, **kwargs, formatter_class=argparse.RawDescriptionHelpFormatter)
        if load in (name, "*"):
            importlib.import_module(module).add_arguments(p)
            p.add_argument("-v", "--verbose", action="store_true",
                           help="say more: reasons whole, library warnings (DeepSpeed, torch) on stderr")  # fmt: skip
            p.epilog = f"{p.epilog}\n\n{exit_codes.HELP}" if p.epilog else exit_codes.HELP
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; a reader that goes away (``dstui status | head -3``) ends it quietly."""
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # what is still buffered meets a closed pipe here, not at exit
    except BrokenPipeError:
        quiet_closed_pipe()
        return 141  # 128 + SIGPIPE, as a shell reports a command a closed pipe ended


def quiet_closed_pipe() -> None:
    """Point stdout at /dev/null so Python's flush at exit does not complain a second time
    (the way the Python docs give for SIGPIPE)."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _main(argv: list[str] | None = None) -> int:
    real_command_line = argv is None  # not a call from Python
    if real_command_line:
        bytecode.reexec_with_cache()
    secrets.private_umask()  # run folders, cmd.txt, the MLflow store: 0700/0600 (core.secrets)
    argv = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in argv if not a.startswith("-")), None)
    if first is None and not any(a in ("-h", "--help", "--version") for a in argv):
        argv = ["tui", *argv]
        first = "tui"
    elif first not in COMMANDS and first is not None and first.endswith((".yaml", ".yml")):
        argv = ["tui", *argv]  # `dstui SPEC.yaml` opens the TUI on that spec
        first = "tui"
    parser = build_parser(first if first in COMMANDS else None)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command not in ("tui", "demo"):  # the Textual app owns the terminal
        secrets.mask_output()  # no credentials or hidden env values in anything a command prints
        terminal.guard_output()  # no escape sequence from a run or spec reaches the terminal (core.terminal)
    if args.command != "supervise":  # the supervisor's stdout is its log already
        library_logs.route(verbose=getattr(args, "verbose", False))
    code = _run_command(importlib.import_module(COMMANDS[args.command][0]), args)
    if real_command_line and args.command in ENDS_QUICKLY:  # never a caller's own process (tests call main())
        quick_exit.end(code)
    return code


def writes_home(args: argparse.Namespace) -> bool:
    """Whether a command writes to the runs home (all but those that only print).

    `status` asks by itself (dstui.commands.status): it shows what it can read of a home that cannot be written.
    """
    if args.command in ("list", "status") or getattr(args, "dry_run", False):
        return False
    return args.command != "ui" or bool(getattr(args, "start", False))


def _run_command(module: object, args: argparse.Namespace) -> int:
    """The command's work; a DstuiError, or a disk that cannot be written, is one line and an exit status."""
    fmt = _machine.wants(args)

    def refuse(why: str, code: int) -> int:
        print(f"dstui: error: {why}", file=sys.stderr)
        if fmt is not None:
            _machine.emit({"error": why, "exit_code": code}, one_line=fmt == "jsonl")
        return code

    with _machine.machine_output(fmt is not None):
        try:
            if writes_home(args):
                home_check.check_writable()  # a read-only or full home: said before anything is written
            return int(module.run(args) or 0)  # type: ignore[attr-defined]
        except DstuiError as e:
            return refuse(str(e), exit_codes.NOT_FOUND if isinstance(e, NotFound) else exit_codes.BAD_INPUT)
        except KeyboardInterrupt:
            print("\ndstui: interrupted", file=sys.stderr)
            return exit_codes.INTERRUPTED
        except Exception as e:
            why = home_check.problem_of(e)  # the disk filled, or went read-only, part way
            if why is None:
                raise
            return refuse(why, exit_codes.BAD_INPUT)


if __name__ == "__main__":
    sys.exit(main())
