"""The executor backends and their registry: a batch's runs start, are followed and stop through one.

The names and where each backend lives are :mod:`dstui.core.executors` (the
spec and the CLI read them there); this module imports a backend only when a
batch, a plan or a run's status names it, so ``dstui status`` never pays for
Slurm's. What a backend is: :class:`~dstui.execute.backends.base.Backend`.

* :func:`get` — the shared instance of a backend, for a plan (capacity,
  preflight, preview) and for one run's status (alive, cancel);
* :func:`for_batch` — a new instance bound to one batch's ``batch.json``
  (the supervisor's: Slurm's job options, the batch's ``parallel``);
* :func:`for_run` — the backend a run's job went to: its ``status.json`` says
  (``executor``), else its batch does.
"""

from __future__ import annotations

import importlib
from typing import Any

from dstui.core import executors
from dstui.core.errors import DstuiError
from dstui.core.rundir import RunDir
from dstui.execute.backends.base import Backend

OPTIONS = "executor_options"  # batch.json: the backend's own options (Backend.batch_options)

_shared: dict[str, Backend] = {}


def backend_class(name: str) -> type:
    """The class registered under ``name``, imported now; one line when it cannot be."""
    entry = executors.entry(name)
    if entry is None:
        raise DstuiError(f"unknown executor {name!r}; known: {', '.join(executors.names())}")
    module, _, attr = entry.target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except Exception as e:  # a module named in $DSTUI_EXECUTORS may fail any way on import: one line, no traceback
        raise DstuiError(f"executor {name!r}: cannot load {entry.target} ({type(e).__name__}: {e})") from None


def get(name: str | None = None) -> Backend:
    """The shared instance of the named backend (default: local), made on first use."""
    name = name or executors.DEFAULT
    if name not in _shared:
        _shared[name] = backend_class(name)({})
    return _shared[name]


def for_batch(info: dict[str, Any]) -> Backend:
    """A backend of its own for one batch, from its batch.json (the supervisor's)."""
    return backend_class(info.get("executor") or executors.DEFAULT)(info)


def for_status(st: dict[str, Any] | None) -> Backend:
    """The backend that started (or will start) a job, by the name its status records."""
    return get((st or {}).get("executor"))


def for_run(rd: RunDir, st: dict[str, Any] | None = None) -> Backend:
    """The backend of a run: its status's executor, else its batch's (a run not started yet)."""
    st = rd.status() if st is None else st
    return get(st.get("executor") or rd.batch.info().get("executor"))
