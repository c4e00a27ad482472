"""`dstui status [BATCH]`: batches and runs, read from their folders.

Also takes over any unfinished batch whose supervisor died, so metrics
ingestion resumes where it stopped. Says where the runs are looked for (the
runs home: DSTUI_HOME, a project's runs/, or the default, see
:func:`dstui.core.paths.home_choice`). Exit status 1 when a shown run failed or
was cancelled, 3 when there is no batch.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
import textwrap
import time
from pathlib import Path

from dstui.commands import _argtypes, _machine
from dstui.commands._common import runs_table
from dstui.commands._records import batch_record, exit_code_of, home_record
from dstui.commands._tables import terminal_width
from dstui.core import exit_codes, home_check, paths, phases, terminal
from dstui.core.errors import NotFound
from dstui.core.records import bad_lines_note
from dstui.core.rundir import BatchDir, RunDir, list_batches
from dstui.usecases import takeover
from dstui.usecases.watch import batch_notes


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("batch", nargs="?", help="batch id, folder or shell pattern over ids (default: the newest batches)")
    p.add_argument("-n", type=_argtypes.count(1), default=3, help="how many recent batches to show (default 3)")
    p.add_argument("--no-takeover", action="store_true", help="do not restart dead supervisors")
    p.add_argument("--follow", "-f", action="store_true",
                   help="follow the batch (the newest, or BATCH) until its runs end, as `dstui run` does")  # fmt: skip
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true",
                     help="one JSON document: the runs home and every shown batch with each run's state, "
                     "step, reason and metrics (with --follow: once the runs end)")  # fmt: skip
    out.add_argument("--jsonl", action="store_true",
                     help="JSON Lines: one record per batch; with --follow a record per run change, "
                     "then the batch (as `dstui run --jsonl`)")  # fmt: skip


def chosen_batches(root: Path, ref: str | None, n: int) -> list[BatchDir]:
    """The batch named (id, folder, pattern), or the ``n`` newest; NotFound (exit 3) for a name that matches none."""
    if not ref:
        return list_batches(root)[:n]
    for candidate in (root / ref, Path(ref)):
        if (candidate / "batch.json").is_file():
            return [BatchDir(candidate)]
    matched = [b for b in list_batches(root) if fnmatch.fnmatchcase(b.id, ref)]
    if not matched:
        raise NotFound(f"no batch '{ref}' under {paths.home_choice().describe()}")
    return matched


def run(args: argparse.Namespace) -> int:
    """The batches as they are; a home that cannot be written is shown too, its one line said, exit 2.

    A full disk is when a person most needs to see the runs (a batch waiting for
    space says so in its notes), so `status` does not refuse it as the commands
    that write do (dstui.cli): it reads, settles and restarts nothing, and ends
    with the same one line and exit status as they do.
    """
    root = paths.runs_dir()
    unwritable = home_check.unwritable()
    if unwritable is None:
        takeover.settle_all(root)  # batches a killed `dstui run` left half-made: every run gets listed
    fmt = _machine.wants(args)
    batches = chosen_batches(root, args.batch, args.n)
    if not batches:
        code = nothing_here(root, fmt, unwritable)
        return said_unwritable(unwritable) if unwritable else code
    policy = takeover.Takeover(enabled=not args.no_takeover, writes=unwritable is None)
    if args.follow:
        from dstui.commands._follow_out import follow

        policy.look_one(batches[0])
        code = follow(batches[0], fmt=fmt, verbose=getattr(args, "verbose", False))
        return said_unwritable(unwritable) if unwritable else code
    if fmt is None:
        print(f"runs: {paths.home_choice().describe()}\n")
    docs = []
    looked_after = policy.look(batches)  # supervisors restarted where they died (the one takeover rule)
    for b in batches:
        info = b.info()
        note = looked_after[b.id]
        notes = batch_notes(info, b.path)
        if fmt is not None:
            doc = batch_record(b, supervision=note, notes=notes)
            docs.append(doc)
            if fmt == "jsonl":
                _machine.emit(doc, one_line=True)
            continue
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(info.get("created", 0)))
        width = terminal_width()  # notes wrapped here: a line the terminal wraps loses its indent
        print(fill(f"{b.id}  [{info.get('experiment')}]  created {created}  {note}", width))
        for line in notes:
            print(fill(f"  ! {terminal.printable(line)}", width))
        print(runs_table(b, verbose=getattr(args, "verbose", False), width=width))
        for line in time_lines(b.runs()):
            print(fill(line, width))
        print()
        docs.append(batch_record(b))
    code = exit_code_of([r for d in docs for r in d["runs"]])
    trouble = {"error": unwritable, "exit_code": exit_codes.BAD_INPUT} if unwritable else {}
    if fmt == "json":
        _machine.emit({**home_record(), "batches": docs, "exit_code": code, **trouble})
    elif fmt == "jsonl" and trouble:
        _machine.emit(trouble, one_line=True)
    return said_unwritable(unwritable) if unwritable else code


def said_unwritable(why: str) -> int:
    """The line every command says of a home that cannot be written (dstui.cli), after what status could show."""
    print(f"dstui: error: {why}", file=sys.stderr)
    return exit_codes.BAD_INPUT


def nothing_here(root: Path, fmt: str | None, unwritable: str | None = None) -> int:
    """No batches: say where dstui looked and how the home is chosen (exit 3)."""
    if fmt is not None:
        trouble = {"error": unwritable, "exit_code": exit_codes.BAD_INPUT} if unwritable else {}
        doc = {**home_record(), "batches": [], "exit_code": exit_codes.NOT_FOUND, **trouble}
        _machine.emit(doc, one_line=fmt == "jsonl")
        return exit_codes.NOT_FOUND
    print(f"no batches under {paths.home_choice().describe()}")
    print("dstui looks in $DSTUI_HOME/runs, else in the runs/ of the nearest folder (from here up) that holds "
          f"a batch, else in {paths.default_home() / 'runs'}")  # fmt: skip
    print("start one with `dstui run SPEC` or `dstui demo`")
    return exit_codes.NOT_FOUND


def requeue_note(st: dict) -> str | None:
    """A Slurm run whose job started again: its attempt, and the repeated steps not sent (dstui.core.attempt_steps)."""
    n = st.get("requeues")
    if not isinstance(n, int) or n <= 0:
        return None
    repeated = st.get("repeated_steps") or 0
    return f"attempt {n + 1} ({n}x requeued, same MLflow run); {repeated} repeated step record(s) not sent again"


def fill(line: str, width: int) -> str:
    """One note within ``width``: continued lines indented under its text, words never split at hyphens."""
    indent = " " * (len(line) - len(line.lstrip()) + 6)
    return textwrap.fill(line, width=width, subsequent_indent=indent, break_on_hyphens=False, break_long_words=True)


def time_lines(runs: list[RunDir]) -> list[str]:
    """Which GPUs each live run holds, where each finished run's time went, and the batch's step share."""
    lines = []
    statuses = [rd.status() for rd in runs]
    for rd, st in zip(runs, statuses, strict=True):
        if st.get("gpu_slice") and st.get("state") in ("starting", "running"):
            lines.append(f"  gpus  {rd.name}: {','.join(str(g) for g in st['gpu_slice'])}")
        times = phases.from_status(st)
        if times is not None:
            lines.append(f"  time  {rd.name}: {times.line()}")
        bad = bad_lines_note(st)
        if bad:
            lines.append(f"  bad   {rd.name}: {bad}")
        requeued = requeue_note(st)
        if requeued:
            lines.append(f"  requeued {rd.name}: {requeued}")
        caches = phases.compile_cache_line(st.get("summary"))
        if caches:
            lines.append(f"  cache {rd.name}: {caches}")
    share = phases.batch_step_share(statuses)
    if share is not None:
        lines.append(
            f"  step share {share[0]:.0%}: {share[1]:.1f} s of optimizer steps in {share[2]:.1f} s of wall time"
        )
    return lines
