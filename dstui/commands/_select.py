"""Which runs a reference names, for `dstui cancel` and `dstui retry`: batches, runs and patterns.

A reference is, first match wins:

* a run folder or a batch folder (a path);
* ``BATCH/RUN``: runs of batches whose id matches BATCH, named like RUN (each may be a shell pattern);
* a batch id, or a pattern matching batch ids: every run of those batches;
* a run name, or a pattern matching run names: in the newest batch that has such runs.

Any batch under the runs home can be named, not only the newest.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

from dstui.core import paths
from dstui.core.errors import NotFound
from dstui.core.rundir import BatchDir, RunDir, list_batches


def _match(name: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(name, pattern)


def _folder(ref: str) -> list[RunDir] | None:
    p = Path(ref)
    if (p / "status.json").is_file():
        return [RunDir(p.resolve())]
    if (p / "batch.json").is_file():
        return BatchDir(p.resolve()).runs()
    return None


def runs_of(ref: str, batches: list[BatchDir]) -> list[RunDir]:
    """The runs one reference names among ``batches`` (newest first); [] when none."""
    if "/" in ref and not ref.startswith((".", "/")):
        batch_pat, _, run_pat = ref.partition("/")
        return [rd for b in batches if _match(b.id, batch_pat) for rd in b.runs() if _match(rd.name, run_pat)]
    by_batch = [b for b in batches if _match(b.id, ref)]
    if by_batch:
        return [rd for b in by_batch for rd in b.runs()]
    for b in batches:  # newest first: a run name means the newest batch that has it
        found = [rd for rd in b.runs() if _match(rd.name, ref)]
        if found:
            return found
    return []


def select_runs(refs: list[str], root: Path | None = None) -> list[RunDir]:
    """Every run the references name, once each, in the order named; NotFound for a reference naming none."""
    root = root or paths.runs_dir()
    batches = list_batches(root)
    out: dict[Path, RunDir] = {}
    for ref in refs:
        found = _folder(ref)
        if found is None:
            found = runs_of(ref, batches)
        if not found:
            raise NotFound(f"no batch or run matches '{ref}' under {root}")
        for rd in found:
            out.setdefault(rd.path, rd)
    return list(out.values())


def names_whole_batch(ref: str, root: Path | None = None) -> bool:
    """Whether a reference names whole batches (a batch id, folder or a pattern over batch ids)."""
    if (Path(ref) / "batch.json").is_file():
        return True
    if "/" in ref:
        return False
    return any(_match(b.id, ref) for b in list_batches(root or paths.runs_dir()))
