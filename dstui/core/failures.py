"""Why a run failed, from its exit status and the tail of its log.

The reason becomes the ``dstui.reason`` tag and the status line in the TUI,
so it is phrased for a person: the most specific known cause wins.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

from dstui.core import secrets

# (pattern, reason), most specific first.
KNOWN_CAUSES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED", re.I), "CUDA out of memory"),
    (re.compile(r"Watchdog caught collective operation timeout|NCCL.*(timeout|timed out)|ProcessGroup\w*.*[Tt]imeout|DistBackendError.*[Tt]imeout"), "NCCL / process-group timeout"),
    (re.compile(r"invalid literal for int\(\) with base 10: '\d+a'"), "DeepSpeed op build failed (TORCH_CUDA_ARCH_LIST with an 'a' suffix; use e.g. 9.0)"),
    (re.compile(r"Error building extension|ninja: build stopped|RuntimeError: Error compiling objects"), "DeepSpeed op build failed"),
    (re.compile(r"No space left on device|ENOSPC"), "disk full (No space left on device)"),
)

@dataclass(frozen=True)
class Trouble:
    """A run that went wrong, for whoever raises the alarm (`dstui run`'s line, the TUI's toast)."""

    kind: str  # 'failed', 'killed' (the run's state), or 'flagged' (the live guard, still running)
    text: str  # its reason, or the guard's message
    hung: bool = False  # ended by the hang or stall guard
    cancelled: bool = False  # killed because someone asked


def trouble(st: dict) -> Trouble | None:
    """What is wrong with a run, from its status.json; None while nothing is."""
    state = st.get("state")
    reason = st.get("reason") or ""
    if state in ("failed", "killed"):
        return Trouble(state, reason or "no reason recorded", hung=reason.startswith(("hung", "stalled")),
                       cancelled=state == "killed" and reason.startswith("cancelled"))  # fmt: skip
    flag = (st.get("diverged") or {}).get("message")
    return Trouble("flagged", flag) if flag else None


#: a reason is kept whole (status.json, the MLflow tag, `dstui status -v`); only a pathological line is cut
MAX_REASON_CHARS = 2000

_RANK = r"(?:\[rank ?\d+\]:?\s*)?"
# argparse's refusal: "PROG: error: MESSAGE", PROG whatever the program is called ("train.py",
# "/abs/runners/train.py", "-c" for `python -c`, prog='mytrainer'); believed when PROG ends in .py
# or a "usage: PROG" line came before it, as argparse prints one
_ARGPARSE_ERROR = re.compile(rf"^{_RANK}(?P<prog>\S(?:.*?\S)?): error: (?P<msg>.+)$")
_USAGE = re.compile(rf"^{_RANK}usage: (?P<rest>.+)$")
_EXC_LINE = re.compile(rf"^{_RANK}([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b.*)$")
# an exception line a program printed itself, not in a traceback: "RuntimeError: message"
_OWN_EXC_LINE = re.compile(rf"^{_RANK}((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception): .+)$")
# device and communication errors, named with their own words (the line they are on)
_DEVICE_ERRORS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"NCCL error|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|ncclInvalidUsage|ncclRemoteError"), "NCCL error"),
    (re.compile(r"CUDA error: |CUDA driver error|cuDNN error: |CUBLAS_STATUS_\w+|CUDA kernel errors"), "CUDA error"),
)


def _last_match(pattern: re.Pattern[str], log_tail: str) -> str | None:
    """Group 1 of the last line (stripped) that ``pattern`` matches."""
    found = None
    for line in log_tail.splitlines():
        m = pattern.match(line.strip())
        if m:
            found = m.group(1)
    return found


def last_exception(log_tail: str) -> str | None:
    """The last 'SomethingError: message' line of a Python traceback, if any."""
    return _last_match(_EXC_LINE, log_tail)


def own_exception(log_tail: str) -> str | None:
    """The last ``SomethingError: message`` line anywhere (a program's own report, no traceback)."""
    return _last_match(_OWN_EXC_LINE, log_tail)


def runner_error(log_tail: str) -> str | None:
    """The last argparse refusal ``PROG: error: ...`` of the program, whatever it is called.

    A path before the program's name is left out (``/x/runners/train.py`` -> ``train.py``).
    """
    lines = [line.strip() for line in log_tail.splitlines()]
    usages = [m["rest"] for m in map(_USAGE.match, lines) if m]
    last = next((line for line in reversed(lines) if line), None)
    for line in reversed(lines):
        m = _ARGPARSE_ERROR.match(line)
        if not m:
            continue
        prog = m["prog"]
        # the program's own last words (`sys.exit("mytrainer: error: ...")` prints them last) count too
        if prog.endswith(".py") or line is last or any(u == prog or u.startswith(prog + " ") for u in usages):
            name = prog.rsplit("/", 1)[-1] if prog.endswith(".py") else prog
            return f"{name}: error: {m['msg']}"
    return None


def device_error(log_tail: str) -> str | None:
    """``NCCL error: <its line>`` / ``CUDA error: <its line>``: the last line naming one, in its own words."""
    found = None
    for line in log_tail.splitlines():
        for pattern, label in _DEVICE_ERRORS:
            if pattern.search(line):
                text = _RANK_PREFIX_ANY.sub("", line.strip())
                found = text if text.startswith(label) else f"{label}: {text}"
                break
    return found


_RANK_PREFIX_ANY = re.compile(r"^\[rank ?\d+\]:?\s*")


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


# faulthandler's header names the signal in words; the launcher's line gives its number
_FATAL = re.compile(r"Fatal Python error: (Segmentation fault|Aborted|Bus error|Floating point exception|Illegal instruction)")
_FATAL_SIGNALS = {
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Floating point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}
_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+ in (\S+)')
_LAUNCHER_EXIT = re.compile(r"--local_rank=(\d+).*exits with return code = (-?\d+)")
_LAUNCHER_PROCS = re.compile(r"num_local_procs=(\d+)")
_RANK_PREFIX = re.compile(r"^\[rank(\d+)\]:")
# dstui.execute.injob.ranks (the default single-node starter) names the rank that failed first
_STARTER_FAILED = re.compile(r"dstui ranks: rank (\d+) failed \((SIG[A-Z0-9]+|signal \d+)\)")
SIGKILL_HINT = " (killed from outside: the kernel's OOM killer when host memory ran out, or a kill -9)"


def short_path(path: str) -> str:
    """A frame's file as a reader knows it: from the package down (deepspeed/runtime/engine.py)."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[-2:])


def fault_dumps(log_tail: str) -> list[tuple[str | None, str, str | None]]:
    """Each faulthandler dump in the log, in order: (rank if the line says it, signal, innermost frame)."""
    lines = log_tail.splitlines()
    dumps = []
    for i, line in enumerate(lines):
        m = _FATAL.search(line)
        if not m:
            continue
        p = _RANK_PREFIX.match(line.strip())
        frame = None
        for nxt in lines[i + 1 : i + 40]:
            f = _FRAME.match(nxt.split("]:", 1)[-1] if nxt.startswith("[rank") else nxt)
            if f:
                frame = f"{short_path(f.group(1))}:{f.group(2)}"
                break
        dumps.append((p.group(1) if p else None, _FATAL_SIGNALS[m.group(1)], frame))
    return dumps


def _launcher_death(log_tail: str) -> tuple[str | None, str] | None:
    """(rank, signal) from DeepSpeed launcher's 'exits with return code = -N' line.

    That line prints the command of the *last* rank it started whichever rank
    failed (deepspeed/launcher/launch.py's sigkill_handler reuses the loop's
    ``cmd``), so its rank is only believed when the launcher started one process
    (``num_local_procs=1``) or did not say how many.
    """
    found = None
    for line in log_tail.splitlines():
        m = _LAUNCHER_EXIT.search(line)
        if m and int(m.group(2)) < 0:
            found = (m.group(1), signal_name(-int(m.group(2))))
    if found is None:
        return None
    procs = _LAUNCHER_PROCS.findall(log_tail)
    return (found[0] if not procs or procs[-1] == "1" else None), found[1]


def signal_death(log_tail: str, exit_code: int | None, sig: int | None = None) -> str | None:
    """'rank 2: SIGSEGV in deepspeed/runtime/engine.py:_initialize_deepcompile_native', or None.

    Which rank and signal: dstui's rank starter's 'rank N failed (SIGX)' line
    (it reaps the ranks itself, so this holds for any number of ranks), else a
    faulthandler dump (``PYTHONFAULTHANDLER`` is set for every job), else DeepSpeed's
    launcher line (see :func:`_launcher_death`), else the job's own exit status.
    The frame is the innermost one of that signal's first dump.
    """
    dumps = fault_dumps(log_tail)
    rank = name = None
    starter = _STARTER_FAILED.findall(log_tail)
    launcher = _launcher_death(log_tail)
    if starter:
        rank, name = starter[0]
    elif dumps:
        rank, name = dumps[0][0], dumps[0][1]
    elif launcher:
        rank, name = launcher
    if rank is None and launcher and (name is None or name == launcher[1]):
        rank = launcher[0]
    frame = next((f for _r, n, f in dumps if n == name and f), None)
    if name is None:
        number = sig or (-exit_code if exit_code is not None and exit_code < 0 else None)
        if number is None and exit_code is not None and 224 < exit_code < 256:
            number = 256 - exit_code  # the DeepSpeed launcher's sys.exit(-N): "exit code 245" is SIGSEGV
        if not number:
            return None
        name = signal_name(number)
    if rank is not None:
        text = f"rank {rank}: {name}"
    else:
        text = name if frame else f"killed by {name}"
    if frame:
        text += f" in {frame}"
    elif name == "SIGKILL":
        text += SIGKILL_HINT
    return text


def classify(log_tail: str, exit_code: int | None, sig: int | None = None) -> str:
    """The reason, without credentials or hidden env values (it goes to status, MLflow and terminals)."""
    return secrets.mask_text(_classify(log_tail, exit_code, sig))


def _classify(log_tail: str, exit_code: int | None, sig: int | None) -> str:
    """The most specific cause first: known causes, a death by a signal, the device's own error line,
    the program's argparse refusal, its exception line; else the exit status."""
    for pattern, reason in KNOWN_CAUSES:
        if pattern.search(log_tail):
            return reason
    death = signal_death(log_tail, exit_code, sig)
    if death:
        return death
    for found in (device_error(log_tail), runner_error(log_tail)):
        if found:
            return _whole(found)
    exc = last_exception(log_tail) if "Traceback" in log_tail else None
    exc = exc or own_exception(log_tail)
    if exc:
        return _whole(f"Python: {exc}")
    if exit_code is None:
        return "exit status unknown (process vanished)"
    return f"exit code {exit_code}"


def _whole(reason: str) -> str:
    """The reason as the program said it; only a pathological line is cut (with a mark)."""
    return reason if len(reason) <= MAX_REASON_CHARS else reason[: MAX_REASON_CHARS - 1] + "…"


def is_oom(reason: str | None) -> bool:
    """True for CUDA/host out-of-memory failures (the reason tag names them)."""
    text = (reason or "").lower()
    return "out of memory" in text or "outofmemory" in text or text.strip() == "oom"
