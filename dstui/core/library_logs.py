"""Library warnings (DeepSpeed, torch, Python's warnings) go to a log file, not into dstui's output.

DeepSpeed logs "Setting accelerator to CPU ..." on import through its own
``DeepSpeed`` logger, whose handler writes to stdout: it opened the output of
`dstui list`, `report` and `demo`, broke `--json`, and came back after quitting
the TUI. :func:`route` puts a filter on that logger before DeepSpeed is imported
(a logger's filters survive the handler DeepSpeed adds to it later), captures
Python warnings (torch's UserWarnings and FutureWarnings), and sends all of it to
``<home>/logs/libraries.log``; with ``-v`` each line also goes to stderr.

Nothing here imports DeepSpeed or torch; the file is created only when a line is written.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from dstui.core import paths

LOG_NAME = "libraries.log"
LIBRARY_LOGGERS = ("DeepSpeed", "torch", "py.warnings")
FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


class _LazyFileHandler(logging.FileHandler):
    """A file handler that makes its folder at the first line, and never lets a write failure show."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, delay=True, encoding="utf-8")

    def _open(self):  # noqa: ANN202 - logging's own
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()

    def emit(self, record: logging.LogRecord) -> None:
        # logging opens the file (our _open: the folder first) outside its own error handling
        try:
            super().emit(record)
        except OSError:
            self.handleError(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        """A home that cannot be written (read-only, full) costs the log, not the command."""


class _Divert(logging.Filter):
    """On a library's logger: hand each record to dstui's handlers, and stop it there."""

    def __init__(self, handlers: list[logging.Handler]) -> None:
        super().__init__()
        self.handlers = handlers

    def filter(self, record: logging.LogRecord) -> bool:
        for h in self.handlers:
            if record.levelno >= h.level:
                h.handle(record)
        return False


_installed: _Divert | None = None


def log_file() -> Path:
    return paths.logs_dir() / LOG_NAME


def route(*, verbose: bool = False) -> Path:
    """Send library log records and Python warnings to :func:`log_file` (and stderr with ``verbose``)."""
    global _installed
    path = log_file()
    handlers: list[logging.Handler] = [_LazyFileHandler(path)]
    if verbose:
        handlers.append(logging.StreamHandler(sys.stderr))
    fmt = logging.Formatter(FORMAT)
    for h in handlers:
        h.setFormatter(fmt)
    divert = _Divert(handlers)
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        if _installed is not None:
            logger.removeFilter(_installed)
        logger.addFilter(divert)
    _installed = divert
    # warnings.warn -> the py.warnings logger, diverted above. Off first: captureWarnings(True) does
    # nothing when it was on already, even if a `warnings.catch_warnings()` block has since put the
    # old showwarning back (seen in the test suite: a second route() in one process logged nothing)
    logging.captureWarnings(False)
    logging.captureWarnings(True)
    return path
