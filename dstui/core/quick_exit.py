"""Ending a process whose work is done without Python's teardown of every module it imported.

At exit Python frees every object of every module. A batch supervisor holds MLflow,
SQLAlchemy, pandas and their kin (about 2,200 modules, 270,000 objects): that
teardown alone measured 0.7 CPU-s, a fifth of a short batch's supervisor, paid by
every batch a user or the test suite runs (docs/BENCHMARKS.md, "Supervisor cost").
Nothing of it is needed once the work is done: what an exit must still do, the
exit handlers (logging's flush and close, MLflow's own) and the flush of stdout
and stderr, is done here, in the order Python's own exit does it, before
``os._exit``. Stdlib only.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn


def waits_for_threads() -> bool:
    """A thread other than the main one that Python's exit would wait for (not a daemon) still runs."""
    main = threading.main_thread()
    return any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate())


def end(code: int) -> NoReturn:
    """Exit with ``code`` now: exit handlers, then flushed output, then ``os._exit`` (no module teardown).

    Where that could lose something an ordinary exit would not (a non-daemon thread
    still at work, which Python would join first), or this Python has no way to run
    its exit handlers early, it is the ordinary exit.
    """
    run_handlers = getattr(atexit, "_run_exitfuncs", None)  # CPython's own exit step, there since 2.x
    if run_handlers is None or waits_for_threads():
        raise SystemExit(code)
    run_handlers()  # also unregisters them: none runs twice
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream: nothing more to say there
            stream.flush()
    os._exit(code)
