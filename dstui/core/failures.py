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


def classify(log_tail: str, exit_code: int | None, sig: int | None = None) -> str:
    for pattern, reason in KNOWN_CAUSES:
        if pattern.search(log_tail):
            return reason
    own = runner_error(log_tail)
    if own:
        return own[:300]
    exc = last_exception(log_tail)
    if exc and "Traceback" in log_tail:
        return f"Python: {exc[:300]}"
    if sig:
        return f"killed by {signal_name(sig)}"
    if exit_code is not None and exit_code < 0:
        return f"killed by {signal_name(-exit_code)}"
    if exit_code is None:
        return "exit status unknown (process vanished)"
    return f"exit code {exit_code}"


def is_oom(reason: str | None) -> bool:
    """True for CUDA/host out-of-memory failures (the reason tag names them)."""
    text = (reason or "").lower()
    return "out of memory" in text or "outofmemory" in text or text.strip() == "oom"
