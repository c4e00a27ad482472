"""The executors dstui knows by name: where the spec, the CLI and the registry read them.

An executor is a way of starting a batch's runs (this machine's process groups,
Slurm jobs, ...); its code is a backend in :mod:`dstui.execute.backends`. The
spec (``executor:``) and ``dstui run --executor`` may not import that stage, so
the names live here, each with where its backend is found (``module:Class``,
imported only when a batch uses it) and the one fact the spec needs before
that: whether the executor places a multi-node run's nodes itself (else
``nodes > 1`` needs DeepSpeed's hostfile).

A new built-in executor is its backend module plus one line in :data:`BUILTIN`.
Executors that are not part of dstui (a site's own scheduler, a test's) are
named in the environment, so every process dstui starts (the supervisor, a
takeover, a job's wrapper waking a supervisor) knows them too::

    DSTUI_EXECUTORS="mine=site_pkg.backend:MyBackend,other=pkg.mod:Other+nodes"

(``+nodes``: it places nodes itself). An entry that is not of that shape is
left out, and the spec then names the executors it does know.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

ENV = "DSTUI_EXECUTORS"
DEFAULT = "local"


@dataclass(frozen=True)
class Entry:
    """Where an executor's backend lives, and what the spec must know of it."""

    target: str  # "package.module:Class", imported on first use
    places_nodes: bool = False  # it allocates a multi-node run's nodes (no hostfile needed)


BUILTIN: dict[str, Entry] = {
    "local": Entry("dstui.execute.backends.local:LocalBackend"),
    "slurm": Entry("dstui.execute.backends.slurm:SlurmBackend", places_nodes=True),
}

_ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_-]{0,39})=([A-Za-z_][\w.]*:[A-Za-z_]\w*)(\+nodes)?$")


def from_environment(value: str | None = None) -> dict[str, Entry]:
    """The executors named in ``$DSTUI_EXECUTORS`` (comma-separated ``name=module:Class[+nodes]``)."""
    text = os.environ.get(ENV, "") if value is None else value
    out: dict[str, Entry] = {}
    for item in text.split(","):
        m = _ENTRY.match(item.strip())
        if m and m.group(1) not in BUILTIN:  # a built-in name is never redirected
            out[m.group(1)] = Entry(m.group(2), places_nodes=bool(m.group(3)))
    return out


def table() -> dict[str, Entry]:
    """Every executor known now: the built-in ones first, then the environment's."""
    return {**BUILTIN, **from_environment()}


def names() -> tuple[str, ...]:
    return tuple(table())


def entry(name: str) -> Entry | None:
    return table().get(name)


def places_nodes(name: str) -> bool:
    found = entry(name)
    return bool(found and found.places_nodes)
