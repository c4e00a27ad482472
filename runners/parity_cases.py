"""Several parity runs in one launch of ``compare_loss.py``: ``--cases FILE``.

A parity run of a tiny model trains for a second or two; starting its ranks (torch,
DeepSpeed and its engine's imports, the process group) costs ~6 CPU-s each
(docs/BENCHMARKS.md, "Rank start-up"). A matrix of recipes (stages x accumulation x
dtypes, injected faults) therefore spends nearly all its time starting ranks. With
``--cases`` the ranks start once and run the cases one after another, each exactly as a
launch of its own would: its own argv, its own environment (``$DSTUI_PARITY_INJECT``),
its own metrics file, its own output log (both ranks' stdout and stderr) and its own
exit code, written by rank 0 to the case's ``exit_file`` once both ranks are done.

The file is JSON: a list of ``{"argv": [...], "env": {...}, "log": PATH, "exit_file": PATH}``.
What carries over from one case to the next is the process: the process group, the
JIT-op cache, imported modules. Each case builds its model, engine and baselines anew
from its seed, and the fault injections patch instances, not modules. DeepSpeed keeps
its parallel topology in module globals (``deepspeed.utils.groups``: the mpu and the
data-parallel group a pipeline engine sets), so all cases of one launch must have the
same ``--pipeline-stages``; a file that mixes them is refused before any case runs.

An error in a case (exit 2) ends the launch the way a launch of that case alone ends:
its peer may be waiting in a collective, so the remaining cases get no exit file.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A cases file is written by a test harness or a script, not typed; still bounded.
MAX_CASES = 256
MAX_FILE_BYTES = 1 << 20


@dataclass(frozen=True)
class Case:
    argv: list[str]
    env: dict[str, str]
    log: Path
    exit_file: Path


def load(path: str) -> list[Case]:
    """The cases of ``path``; ``SystemExit`` with one line for a file that is not a list of cases."""
    where = f"compare_loss.py: error: --cases {path}"
    try:
        raw = Path(path).read_bytes()[: MAX_FILE_BYTES + 1]
        if len(raw) > MAX_FILE_BYTES:
            raise SystemExit(f"{where}: over {MAX_FILE_BYTES} bytes")
        items = json.loads(raw)
    except (OSError, ValueError) as e:
        raise SystemExit(f"{where}: {e}") from None
    if not isinstance(items, list) or not items or len(items) > MAX_CASES:
        raise SystemExit(f"{where}: not a list of 1 to {MAX_CASES} cases")
    cases = []
    for i, item in enumerate(items):
        ok = (isinstance(item, dict) and isinstance(item.get("argv"), list)
              and all(isinstance(a, str) for a in item["argv"])
              and isinstance(item.get("env", {}), dict)
              and all(isinstance(k, str) and isinstance(v, str) for k, v in item.get("env", {}).items())
              and isinstance(item.get("log"), str) and isinstance(item.get("exit_file"), str))  # fmt: skip
        if not ok:
            raise SystemExit(f"{where}: case {i + 1} needs argv (strings), log, exit_file and an env of strings")
        cases.append(Case(list(item["argv"]), dict(item.get("env", {})), Path(item["log"]), Path(item["exit_file"])))
    return cases


def refuse_mixed_topologies(stages: list[int]) -> None:
    """DeepSpeed's topology lives in module globals: one ``--pipeline-stages`` per launch."""
    if len(set(stages)) > 1:
        raise SystemExit(f"compare_loss.py: error: --cases mixes --pipeline-stages {sorted(set(stages))}; "
                         "DeepSpeed keeps the topology in module globals: one value per launch")


@contextlib.contextmanager
def output_to(log: Path) -> Iterator[None]:
    """This process's stdout and stderr (file descriptors, so DeepSpeed's loggers too) appended to ``log``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


@contextlib.contextmanager
def environment(env: dict[str, str], cleared: tuple[str, ...]) -> Iterator[None]:
    """``env`` set and the ``cleared`` names unset for one case; the launch's environment back after."""
    before = {k: os.environ.get(k) for k in (*env, *cleared)}
    for k in cleared:
        os.environ.pop(k, None)
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_all(cases: list[Case], run_one: Callable[[list[str]], int], *, rank: Callable[[], int],
            barrier: Callable[[], None], cleared: tuple[str, ...], on_error: Callable[[int], Any]) -> int:
    """Run each case as its own launch would; 0 when every case ran (whatever its verdict).

    ``run_one(argv)`` is compare_loss's run of one parsed argv (0 PASS, 1 FAIL); an
    exception or a refusal is written to the case's log and ``on_error(2)`` ends the launch.
    """
    for case in cases:
        with output_to(case.log), environment(case.env, cleared):
            try:
                code = run_one(case.argv)
            except SystemExit as e:
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr, flush=True)
                code = 2 if e.code not in (0, None) else 0
            except Exception:
                traceback.print_exc()
                code = 2
            if code == 2:
                _write_exit(case, code, rank())
                on_error(2)
        barrier()  # both ranks are done with it: its log and metrics are complete
        _write_exit(case, code, rank())
        gc.collect()  # the case's engine and baselines, before the next one builds its own
    return 0


def _write_exit(case: Case, code: int, rank: int) -> None:
    if rank == 0:
        tmp = case.exit_file.with_name(case.exit_file.name + ".tmp")
        tmp.write_text(f"{code}\n")
        tmp.replace(case.exit_file)
