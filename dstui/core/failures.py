"""Why a run failed, from its exit status and the tail of its log.

The reason becomes the ``dstui.reason`` tag and the status line in the TUI,
so it is phrased for a person: the most specific known cause wins.
"""

from __future__ import annotations

import re
import signal

# (pattern, reason), most specific first.
KNOWN_CAUSES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED", re.I), "CUDA out of memory"),
    (re.compile(r"Watchdog caught collective operation timeout|NCCL.*(timeout|timed out)|ProcessGroup\w*.*[Tt]imeout|DistBackendError.*[Tt]imeout"), "NCCL / process-group timeout"),
    (re.compile(r"invalid literal for int\(\) with base 10: '\d+a'"), "DeepSpeed op build failed (TORCH_CUDA_ARCH_LIST with an 'a' suffix; use e.g. 9.0)"),
    (re.compile(r"Error building extension|ninja: build stopped|RuntimeError: Error compiling objects"), "DeepSpeed op build failed"),
    (re.compile(r"NCCL error|ncclInternalError|ncclSystemError|ncclUnhandledCudaError"), "NCCL error"),
    (re.compile(r"No space left on device|ENOSPC"), "disk full (No space left on device)"),
)

# A runner's own refusal, e.g. "compare_loss.py: error: ..." or "[rank 1] train.py: error: ...".
_RUNNER_ERROR = re.compile(r"^(?:\[rank ?\d+\]:?\s*)?([\w.-]+\.py: error: .+)$")

_EXC_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b.*)$")


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


def runner_error(log_tail: str) -> str | None:
    """The last ``<runner>.py: error: ...`` line: the runner's own words for why it stopped."""
    return _last_match(_RUNNER_ERROR, log_tail)


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
_RANK_PREFIX = re.compile(r"^\[rank(\d+)\]:")


def short_path(path: str) -> str:
    """A frame's file as a reader knows it: from the package down (deepspeed/runtime/engine.py)."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[-2:])


def signal_death(log_tail: str, exit_code: int | None, sig: int | None = None) -> str | None:
    """'rank 1: SIGSEGV in deepspeed/runtime/engine.py:_initialize_deepcompile_native', or None.

    The signal comes from faulthandler's dump (``PYTHONFAULTHANDLER`` is set for every job),
    the DeepSpeed launcher's 'exits with return code = -N' line, or the job's own exit
    status; the frame is the innermost one of the dump; the rank from the launcher's line.
    """
    lines = log_tail.splitlines()
    name = None
    frame = None
    rank = None
    for i, line in enumerate(lines):
        m = _FATAL.search(line)
        if m:
            name = _FATAL_SIGNALS[m.group(1)]
            frame = None
            p = _RANK_PREFIX.match(line.strip())
            rank = p.group(1) if p else rank
            for nxt in lines[i + 1 : i + 40]:
                f = _FRAME.match(nxt.split("]:", 1)[-1] if nxt.startswith("[rank") else nxt)
                if f:
                    frame = f"{short_path(f.group(1))}:{f.group(2)}"
                    break
    for line in lines:
        m = _LAUNCHER_EXIT.search(line)
        if m and int(m.group(2)) < 0:
            rank = m.group(1)
            name = name or signal_name(-int(m.group(2)))
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
        text += " (killed from outside: the kernel's OOM killer when host memory ran out, or a kill -9)"
    return text


def classify(log_tail: str, exit_code: int | None, sig: int | None = None) -> str:
    for pattern, reason in KNOWN_CAUSES:
        if pattern.search(log_tail):
            return reason
    death = signal_death(log_tail, exit_code, sig)
    if death:
        return death
    own = runner_error(log_tail)
    if own:
        return own[:300]
    exc = last_exception(log_tail)
    if exc and "Traceback" in log_tail:
        return f"Python: {exc[:300]}"
    if exit_code is None:
        return "exit status unknown (process vanished)"
    return f"exit code {exit_code}"


def is_oom(reason: str | None) -> bool:
    """True for CUDA/host out-of-memory failures (the reason tag names them)."""
    text = (reason or "").lower()
    return "out of memory" in text or "outofmemory" in text or text.strip() == "oom"
