"""Import existing result folders and logs into MLflow, so old runs sit beside new ones.

Understood inputs (anything else in a log is ignored, and counted):

* the seed's per-step line, via :func:`dstui.core.records.parse_seed_line`:
  ``Epoch 1, Step 10, Loss: 2.345678 sync: True time: 0.123 alloc_mem: 1234 peak_mem: 5678``;
* the closing summary line of DeepSpeedExamples' DeepCompile benchmark
  ``run_acc_lm.py`` (all its variants: with or without ``backend=``/
  ``deepcompile=``, memory in bytes or ``GB``, optional ``samples/s:``/``tokens/s:``)::

      meta-llama/Meta-Llama-3-8B ds=True np=8 batch_size=1 seq=512 zero_stage=1 acc=4 ac=False
      compile=False backend=inductor deepcompile=False passes=None compile_time=0
      iteration time: 0.4782 alloc_mem: 28307113472 peak_mem: 50064946688

  (one line in the log), also when prefixed by a timestamp as in its ``result.txt``;
* a ``key=value`` form of both: ``step=10 loss=2.3 time=0.12 peak_mem=...`` and
  ``model=X world_size=2 micro_batch=1 seq_length=512 zero_stage=3 deepcompile=True iter_time_mean=0.5``;
* the ``Namespace(...)`` argparse dump those scripts print (settings);
* ``NUM_NODES: N`` / ``NGPUS_PER_NODE: N`` lines of the seed's ``run.sh``;
* ``metadata.json`` written by seed 001's ``run_batch_enhanced.sh`` (condition
  names, commands, exit codes, wandb run ids);
* dstui's own ``metrics.jsonl`` (a run folder that never reached MLflow).

A log becomes one MLflow child run per closing summary line (a log holding
several runs is split there; steps after the last summary form a run of
their own, usually one that crashed). Every folder gets a parent run tagged
``dstui.role=batch``, ``dstui.batch=import-<folder name>``, so reports work on
imports exactly as on launched batches. Lines that look like records but do
not parse are counted and reported, never fatal.

Logs are untrusted input, and so is the folder: a file or folder that cannot be read
(permission denied, an I/O error) is listed as skipped with why, and the rest imported;
only when nothing at all can be read is the import refused (:class:`ImportError_`).

An import is only *done* once every step reached MLflow: until then its runs carry
``dstui.status=running`` and no ``steps`` param (MLflow params cannot change), so an
interrupted import (Ctrl-C, SIGTERM, an MLflow error) ends its runs ``killed``/``failed``
with reason ``import interrupted`` and ``steps`` = what was sent, and a second import of
the same path replaces that partial batch without ``--force``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dstui.core.errors import DstuiError
from dstui.core.records import metric_values
from dstui.importer.names import _normalise, params_from_command, params_from_name
from dstui.importer.parse import (
    ParsedLog,
    Segment,
    _is_num,
    parse_kv_line,
    parse_log,
    parse_namespace,
    parse_summary_line,
)
from dstui.tracking import tags as tag_keys

__all__ = [
    "ImportError_", "ImportResult", "ImportedRun", "ParsedLog", "Segment", "import_dir", "parse_kv_line",
    "parse_log", "parse_namespace", "parse_summary_line", "params_from_command", "params_from_name",
]

LOG_SUFFIXES = (".log", ".txt", ".out")
MAX_ARTIFACT_BYTES = 50 << 20
MAX_TAG_CHARS = 5000  # MLflow keeps 8000 characters of a tag value
SEND_POINTS = 1000  # points per MLflow call (tracking.MAX_BATCH)
SHOW_SKIPPED = 30  # skipped files listed by name in the summary (the rest counted)
INTERRUPTED = "import interrupted"
PROGRESS_EVERY_S = 3.0
_RUNDIR = re.compile(r"^logs?_(?P<rev>.+)_run(?P<n>\d+)$")


class ImportError_(DstuiError):
    """The folder cannot be imported (missing, unreadable, already imported)."""


class ImportInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during an import, once its partial runs are marked: says what to run again."""


# -- MLflow --------------------------------------------------------------------------------


@dataclass
class ImportedRun:
    """One MLflow child run created from (part of) a file."""

    source: str
    condition: str
    run_id: str
    steps: int
    status: str
    reason: str
    has_summary: bool
    revision: str = "installed"
    repeat: int = 0
    repeated: int = 0  # step lines left out: that step was logged before (first attempt wins)
    restarts: int = 0  # the steps went backwards this often: a job restarted into the same log
    no_loss: int = 0  # steps imported without a usable loss (nan/inf)


@dataclass
class ImportResult:
    """What an import did: runs created, files skipped (with why), lines not understood."""

    experiment: str
    batch: str
    parent_run_id: str
    runs: list[ImportedRun] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    files: int = 0
    lines: int = 0
    malformed_lines: int = 0
    malformed_examples: list[str] = field(default_factory=list)
    partial_lines: int = 0  # step lines imported without a nan/inf value
    unreadable: int = 0  # files and folders that could not be read
    replaced: str = ""  # the earlier, interrupted import of the same path this one replaced
    repeat_notes: list[str] = field(default_factory=list)  # how logs_<rev>_runN became revision/repeat

    @property
    def steps(self) -> int:
        return sum(r.steps for r in self.runs)

    def _skipped_lines(self) -> list[str]:
        out = [f"  skipped {path}: {why}" for path, why in self.skipped[:SHOW_SKIPPED]]
        if len(self.skipped) > SHOW_SKIPPED:
            out.append(f"  ... and {len(self.skipped) - SHOW_SKIPPED} more skipped")
        return out

    def _line_counts(self) -> list[str]:
        out = [
            f"{self.malformed_lines} malformed line(s) (looked like records, did not parse, not imported) "
            f"out of {self.lines} lines read"
        ]
        repeated = sum(r.repeated for r in self.runs)
        if repeated:
            out.append(f"{repeated} repeated step line(s) left out (step logged before; the first one is kept)")
        if self.partial_lines:
            out.append(f"{self.partial_lines} step line(s) imported without a nan/inf value")
        return out

    def summary_text(self) -> str:
        """Human summary for the CLI (and the TUI's notification)."""
        if not self.parent_run_id:
            out = [f"nothing imported from {self.files} file(s); no MLflow run made"]
            out += self._skipped_lines() + self._line_counts()
            return "\n".join(out)
        lossless = sum(1 for r in self.runs if r.steps and r.no_loss == r.steps)
        out = [
            f"imported {len(self.runs)} run(s)"
            + (f" ({lossless} with no usable loss: nan/inf on every step)" if lossless else "")
            + f", {self.steps} steps, from {self.files} file(s) "
            f"into experiment '{self.experiment}', batch '{self.batch}' (parent run {self.parent_run_id})"
        ]
        if self.replaced:
            out.append(f"  replaced {self.replaced}")
        out += [f"  {note}" for note in self.repeat_notes]
        for r in self.runs:
            extra = f" ({r.reason})" if r.reason else ""
            note = "" if r.has_summary else ", no summary line"
            if r.repeated:
                note += f", {r.repeated} repeated step line(s) left out"
            if r.restarts:
                note += f", restarted {r.restarts} time(s) in the log (first attempt's steps kept)"
            if r.no_loss and r.no_loss < r.steps:
                note += f", {r.no_loss} step(s) without a usable loss"
            where = "" if r.revision == "installed" else f" [revision {r.revision}, repeat {r.repeat}]"
            out.append(f"  {r.condition}{where}: {r.steps} steps, {r.status}{extra}{note} <- {r.source} [{r.run_id}]")
        out += self._skipped_lines() + self._line_counts()
        for ex in self.malformed_examples:
            out.append(f"  e.g. {ex}")
        return "\n".join(out)


def _why(e: OSError) -> str:
    """``permission denied``: what the system said, as a reason a user reads."""
    return (e.strerror or type(e).__name__).lower()


def _walk(root: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(log files under ``root``, folders and entries that could not be read, with why).

    Not ``rglob``: it skips a folder it cannot list without a word, and a stat under a
    folder without search permission raises. Symlinked folders are not followed (no loops).
    """
    if root.is_file():
        return [root], []
    found: list[Path] = []
    unreadable: list[tuple[Path, str]] = []
    todo = [root]
    while todo:
        folder = todo.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError as e:
            unreadable.append((folder, _why(e)))
            continue
        for entry in entries:
            p = Path(entry.path)
            try:
                if entry.is_dir(follow_symlinks=False):
                    todo.append(p)
                elif entry.is_file() and (p.suffix in LOG_SUFFIXES or p.name == "metrics.jsonl"):
                    found.append(p)
            except OSError as e:
                unreadable.append((p, _why(e)))
    # 'x.log' before 'x_detailed.log': the short one is kept when both hold the same steps
    found.sort(key=lambda p: (str(p.parent), p.stem.replace("_detailed", ""), len(p.name)))
    return found, sorted(unreadable)


def _load_metadata(root: Path, skipped: list[tuple[str, str]]) -> dict[str, Any]:
    meta = root / "metadata.json"
    try:
        if not meta.is_file():
            return {}
        text = meta.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        skipped.append((meta.name, _why(e)))
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        # run_batch_enhanced.sh writes it with a heredoc; tolerate its stray commas
        try:
            data = json.loads(re.sub(r",\s*([}\]])", r"\1", text))
        except (ValueError, RecursionError):
            return {}
    except RecursionError:
        return {}
    return data if isinstance(data, dict) else {}


class _Progress:
    """Says how far an import got (stderr, through ``say``) at most every :data:`PROGRESS_EVERY_S`."""

    def __init__(self, say: Callable[[str], None] | None) -> None:
        self.say = say
        self.last = 0.0
        self.file = ""
        self.size = 1

    def start(self, f: Path, size: int) -> None:
        self.file, self.size, self.last = f.name, max(size, 1), time.monotonic()

    def pass_of(self, what: str) -> Callable[[int, int], None]:
        def report(done: int, lines: int) -> None:
            now = time.monotonic()
            if self.say is None or now - self.last < PROGRESS_EVERY_S:
                return
            self.last = now
            self.say(f"import: {self.file}: {what} {done / 2**20:,.1f} of {self.size / 2**20:,.1f} MiB "
                     f"({done / self.size:.0%}), {lines:,} lines")  # fmt: skip

        return report


def import_dir(
    path: str | Path,
    experiment: str = "imported",
    *,
    tracking_uri: str | None = None,
    warmup: int = 1,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
) -> ImportResult:
    """Import a folder (or one file) of logs as an MLflow batch; see the module docstring.

    ``warmup``: leading logged steps of each run to exclude from statistics
    (stored as param ``warmup_steps`` in step units), since old logs do not
    say which of their steps were warm-up; the first usually includes
    compilation. ``force`` replaces an earlier import of the same folder
    instead of refusing to duplicate it. ``progress`` hears a line every few
    seconds (bytes and lines done).

    Each file is read twice as a stream (what it holds, then its steps into MLflow),
    so memory stays bounded whatever its size. MLflow runs are made only for what can
    be imported: a folder with nothing importable leaves no parent run, and every run
    this call made ends FINISHED or FAILED, also when it stops half-way.
    """
    from dstui.core import paths
    from dstui.tracking import client as tracking

    root = Path(path).expanduser().resolve()
    try:
        root.stat()
    except FileNotFoundError:
        raise ImportError_(f"{root}: no such file or folder") from None
    except OSError as e:
        raise ImportError_(f"{root}: cannot be read ({_why(e)})") from None
    folder = root if root.is_dir() else root.parent
    files, unreadable = _walk(root)
    if not files and unreadable:
        raise ImportError_(_nothing_readable(root, unreadable))
    uri = tracking_uri or paths.tracking_uri()
    client = tracking.client(uri)
    exp_id = tracking.ensure_experiment(client, experiment)
    batch, replaced = _batch_id(client, exp_id, f"import-{folder.name}", str(root), force)

    result = ImportResult(experiment=experiment, batch=batch, parent_run_id="", replaced=replaced)
    result.unreadable = len(unreadable)
    result.skipped += [(_rel(p, folder), why) for p, why in unreadable]
    metadata = _load_metadata(folder, result.skipped)
    conditions_meta = metadata.get("conditions") if isinstance(metadata.get("conditions"), dict) else {}
    repeat_bases, result.repeat_notes = _repeat_bases(files, folder)
    say = _Progress(progress)
    seen: dict[tuple[str, str], str] = {}
    opened = _Open()
    read = 0
    try:
        for f in files:
            result.files += 1
            rel = _rel(f, folder)
            try:
                say.start(f, f.stat().st_size)
                parsed = parse_log(f, keep_steps=False, progress=say.pass_of("reading"))
            except OSError as e:
                result.unreadable += 1
                unreadable.append((f, _why(e)))
                result.skipped.append((rel, _why(e)))
                continue
            read += 1
            result.lines += parsed.lines
            result.malformed_lines += parsed.malformed
            result.partial_lines += parsed.partial
            for ex in parsed.malformed_examples:
                if len(result.malformed_examples) < 5:
                    result.malformed_examples.append(f"{f.name}: {ex}")
            if not parsed.segments:
                result.skipped.append((rel, "no step or summary lines"))
                continue
            sig = (str(f.parent), parsed.signature())
            if parsed.step_count and sig in seen:
                result.skipped.append((rel, f"same steps as {seen[sig]}"))
                continue
            seen[sig] = rel
            if not result.parent_run_id:
                result.parent_run_id = opened.parent = _create_parent(client, exp_id, batch, root, folder, metadata)
            runs = _import_file(client, exp_id, result.parent_run_id, batch, f, folder, parsed, conditions_meta, warmup,
                                say, opened, repeat_bases)  # fmt: skip
            result.runs.extend(runs)
    except BaseException as e:
        _mark_stopped(client, opened, e)
        if isinstance(e, KeyboardInterrupt) and opened.parent:
            raise ImportInterrupted(
                f"import interrupted: batch '{batch}' (parent run {opened.parent}) holds what was imported so far, "
                f"its runs marked killed ({INTERRUPTED}); run the same `dstui import {root} --experiment "
                f"{experiment}` again to replace it (no --force needed)"
            ) from e
        raise
    if not read and unreadable:
        raise ImportError_(_nothing_readable(root, unreadable))
    if not result.runs and not result.skipped:
        result.skipped.append((str(root), "no log files (*.log, *.txt, *.out, metrics.jsonl)"))
    if not result.parent_run_id:
        return result  # nothing importable: no MLflow run at all
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    client.log_batch(result.parent_run_id, metrics=[
        Metric("import.runs", float(len(result.runs)), now, 0),
        Metric("import.malformed_lines", float(result.malformed_lines), now, 0),
        Metric("import.lines", float(result.lines), now, 0),
        Metric("import.unreadable", float(result.unreadable), now, 0),
    ])
    client.set_terminated(result.parent_run_id, "FINISHED")
    return result


def _rel(p: Path, folder: Path) -> str:
    try:
        return str(p.relative_to(folder)) if p != folder else p.name
    except ValueError:
        return p.name


def _nothing_readable(root: Path, unreadable: list[tuple[Path, str]]) -> str:
    """One line: the first unreadable path and its reason stand for all of them."""
    first, why = unreadable[0]
    more = f" and {len(unreadable) - 1} more" if len(unreadable) > 1 else ""
    return f"{root}: nothing readable to import: {first} ({why}){more}"


def _repeat_bases(files: list[Path], folder: Path) -> tuple[dict[str, int], list[str]]:
    """Per revision, the N of ``logs_<rev>_runN`` that is repeat 0, and a line saying so.

    The seeds' compare_revisions.sh numbers its runs from 1 (``logs_main_run1``); a folder
    set that has a ``run0`` is taken as numbered from 0. Never a negative repeat.
    """
    numbers: dict[str, set[int]] = {}
    for f in files:
        rd = _rundir_of(f, folder)
        if rd:
            numbers.setdefault(rd[0], set()).add(rd[1])
    bases = {rev: (0 if min(ns) == 0 else 1) for rev, ns in numbers.items()}
    notes = [
        f"revision {rev}: folders run{min(ns)}..run{max(ns)} taken as numbered from {bases[rev]} "
        f"(repeats {min(ns) - bases[rev]}..{max(ns) - bases[rev]})"
        for rev, ns in sorted(numbers.items())[:SHOW_SKIPPED]
    ]
    return bases, notes


def _rundir_of(f: Path, folder: Path) -> tuple[str, int] | None:
    """(revision, N) of a log in a ``logs_<rev>_runN`` folder below the imported one."""
    m = _RUNDIR.match(f.parent.name) if f.parent != folder else None
    return (m.group("rev"), int(m.group("n"))) if m else None


@dataclass
class _Open:
    """Runs this import made and has not ended: what an interruption must mark (steps stored so far)."""

    parent: str = ""
    children: dict[str, int] = field(default_factory=dict)


def _mark_stopped(client: Any, opened: _Open, e: BaseException) -> None:
    """End the runs an import leaves half-done as what they are: partial, with the steps they hold."""
    from dstui.tracking import client as tracking

    interrupted = isinstance(e, KeyboardInterrupt)
    state, mlflow_status = ("killed", "KILLED") if interrupted else ("failed", "FAILED")
    reason = INTERRUPTED if interrupted else f"{INTERRUPTED} by an error: {type(e).__name__}: {e}"[:MAX_TAG_CHARS]
    for rid, stored in list(opened.children.items()):
        with contextlib.suppress(Exception):
            tracking.log_params(client, rid, {"steps": stored})
        with contextlib.suppress(Exception):
            tracking.set_tags(client, rid, {tag_keys.STATUS: state, tag_keys.REASON: reason,
                                            tag_keys.IMPORTED_STEPS: stored})  # fmt: skip
        with contextlib.suppress(Exception):
            client.set_terminated(rid, mlflow_status)
    if opened.parent:
        with contextlib.suppress(Exception):
            tracking.set_tags(client, opened.parent, {tag_keys.STATUS: state, tag_keys.REASON: reason})
        with contextlib.suppress(Exception):
            client.set_terminated(opened.parent, mlflow_status)


def _create_parent(client: Any, exp_id: str, batch: str, root: Path, folder: Path, metadata: dict[str, Any]) -> str:
    """The batch's parent run, made when the first file turned out importable."""
    parent_tags = {
        tag_keys.ROLE: tag_keys.ROLE_BATCH,
        tag_keys.BATCH: batch,
        tag_keys.IMPORTED_FROM: str(root),
        tag_keys.SPEC: "",
    }
    if metadata.get("experiment_date"):
        parent_tags[tag_keys.EXPERIMENT_DATE] = str(metadata["experiment_date"])[:250]
    parent = client.create_run(exp_id, run_name=batch, tags=parent_tags)
    if metadata:
        with contextlib.suppress(OSError):  # gone or unreadable since it was read: the import goes on
            client.log_artifact(parent.info.run_id, str(folder / "metadata.json"), artifact_path="import")
    return parent.info.run_id


def _import_file(
    client: Any, exp_id: str, parent_id: str, batch: str, f: Path, folder: Path, parsed: ParsedLog,
    conditions_meta: dict[str, Any], warmup: int, say: _Progress, opened: _Open, repeat_bases: dict[str, int],
) -> list[ImportedRun]:
    """One child run per segment of the file: made first, then the file's steps streamed into them.

    A file that cannot be read the second time (gone, permissions changed) fails its runs
    with why; the import goes on."""
    from dstui.tracking import client as tracking

    try:
        start = int(f.stat().st_mtime * 1000)
    except OSError:  # read a moment ago; reading it again says what became of it
        start = int(time.time() * 1000)
    made = []
    for i, seg in enumerate(parsed.segments):
        run = _log_segment(client, exp_id, parent_id, batch, f, folder, parsed, seg, i, conditions_meta, warmup, start,
                           repeat_bases)  # fmt: skip
        opened.children[run.run_id] = 0
        made.append(run)
    sender = _StepSender(client, [r.run_id for r in made], start, opened.children)
    broken = ""
    try:
        segments = parse_log(f, keep_steps=False, on_step=sender.add, progress=say.pass_of("sending")).segments
    except OSError as e:
        segments, broken = [], f"log could not be read again: {_why(e)}"
    sender.flush()
    now = int(time.time() * 1000)
    for i, run in enumerate(made):
        sent = opened.children[run.run_id]
        seg = segments[i] if i < len(segments) else None
        metrics = [(f"summary.{k}", float(v), now, 0) for k, v in seg.summary.items() if _is_num(v)] if seg else []
        if sent and "summary.steps" not in {m[0] for m in metrics}:
            metrics.append(("summary.steps", float(sent), now, 0))
        tracking.log_metrics(client, run.run_id, metrics)
        if broken:
            run.status, run.reason = "failed", broken
        run.steps = sent
        with contextlib.suppress(OSError):  # the log itself is a convenience; its steps are in MLflow
            if f.stat().st_size <= MAX_ARTIFACT_BYTES:
                client.log_artifact(run.run_id, str(f), artifact_path="run")
        tracking.log_params(client, run.run_id, {"steps": sent})
        tracking.set_tags(client, run.run_id, {tag_keys.IMPORTED_STEPS: sent, tag_keys.STATUS: run.status,
                                               tag_keys.REASON: run.reason})  # fmt: skip
        client.set_terminated(run.run_id, "FINISHED" if run.status == "done" else "FAILED", end_time=start)
        del opened.children[run.run_id]
    return made


class _StepSender:
    """Steps of a file's segments into their MLflow runs, a log_batch at a time (bounded memory).

    ``stored`` (run id -> steps) only counts steps MLflow accepted, so an interrupted
    import says how many steps its runs really hold."""

    def __init__(self, client: Any, run_ids: list[str], start_ms: int, stored: dict[str, int]) -> None:
        self.client, self.run_ids, self.start_ms, self.stored = client, run_ids, start_ms, stored
        self.counts = [0] * len(run_ids)
        self.pending: list[tuple[str, float, int, int]] = []
        self.pending_steps = 0
        self.pending_run = 0

    def add(self, index: int, rec: dict[str, Any]) -> None:
        if index >= len(self.run_ids):
            return
        if index != self.pending_run:
            self.flush()
            self.pending_run = index
        ts = self.start_ms + self.counts[index]  # timestamps keep the log's order
        self.counts[index] += 1
        self.pending.extend(_step_points(rec, ts))
        self.pending_steps += 1
        if len(self.pending) >= SEND_POINTS:
            self.flush()

    def flush(self) -> None:
        from dstui.tracking import client as tracking

        if self.pending_steps:
            run_id = self.run_ids[self.pending_run]
            tracking.log_metrics(self.client, run_id, self.pending)
            self.stored[run_id] = self.stored.get(run_id, 0) + self.pending_steps
        self.pending, self.pending_steps = [], 0


def _batch_id(client: Any, exp_id: str, base: str, source: str, force: bool) -> tuple[str, str]:
    """(``import-<folder>``, what it replaced); refuses a second import of the same path unless forced.

    An import that did not finish (its parent run FAILED or KILLED: interrupted, or stopped
    by an error) is no import to protect: it is replaced without ``--force``. One still
    RUNNING may be an import going on now, so that one needs ``--force``.
    """
    filt = f"{tag_keys.BATCH_FILTER} and {tag_keys.search(tag_keys.BATCH)} LIKE '{base.replace(chr(39), '')}%'"
    existing = client.search_runs([exp_id], filter_string=filt, max_results=1000)
    taken = {r.data.tags.get(tag_keys.BATCH) for r in existing}
    replaced = ""
    for r in existing:
        if r.data.tags.get(tag_keys.IMPORTED_FROM) != source:
            continue
        old = r.data.tags.get(tag_keys.BATCH)
        partial = r.info.status in ("FAILED", "KILLED")
        if not force and not partial:
            if r.info.status == "RUNNING":
                raise ImportError_(
                    f"{source} is being imported as batch '{old}' (parent run {r.info.run_id} is still running), "
                    "or that import was killed outright; use --force to replace it"
                )
            raise ImportError_(
                f"{source} was already imported as batch '{old}' (parent run {r.info.run_id}); use --force to replace it"
            )
        _delete_batch(client, exp_id, r)
        taken.discard(old)
        what = "the interrupted import" if partial else "the earlier import"
        replaced = f"{what} batch '{old}' (parent run {r.info.run_id}, now deleted)"
    batch, n = base, 1
    while batch in taken:
        n += 1
        batch = f"{base}-{n}"
    return batch, replaced


def _delete_batch(client: Any, exp_id: str, parent: Any) -> None:
    filt = f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"
    for child in client.search_runs([exp_id], filter_string=filt, max_results=10000):
        client.delete_run(child.info.run_id)
    client.delete_run(parent.info.run_id)


def _condition_name(f: Path, metadata_conditions: dict[str, Any]) -> str:
    stem = f.stem
    base = stem[: -len("_detailed")] if stem.endswith("_detailed") else stem
    if base in metadata_conditions:
        return base
    if f.name == "metrics.jsonl":
        for name in ("status.json", "spec.json"):
            p = f.parent / name
            try:
                cond = json.loads(p.read_text(errors="replace")).get("condition") if p.is_file() else None
            except (OSError, ValueError, AttributeError, RecursionError):
                cond = None
            if cond:
                return str(cond)
        return f.parent.name
    return base[len("debug_") :] if base.startswith("debug_") else base


def _log_segment(
    client: Any,
    exp_id: str,
    parent_id: str,
    batch: str,
    f: Path,
    folder: Path,
    parsed: ParsedLog,
    seg: Segment,
    index: int,
    conditions_meta: dict[str, Any],
    warmup: int,
    start: int,
    repeat_bases: dict[str, int],
) -> ImportedRun:
    """The child run of one segment: tags and params (its steps are sent by :class:`_StepSender`).

    Its ``dstui.status`` stays ``running`` and its ``steps`` param unset until every step is
    in MLflow (:func:`_import_file`), so no partial import ever reads as done."""
    condition = _condition_name(f, conditions_meta)
    meta = conditions_meta.get(condition, {}) if isinstance(conditions_meta.get(condition), dict) else {}
    if len(parsed.segments) > 1:
        condition = f"{condition}-{index}"
    # weakest to strongest: file name, metadata command, Namespace dump, summary line
    settings: dict[str, Any] = {}
    settings.update(params_from_name(f.stem))
    if meta.get("command"):
        settings.update(params_from_command(str(meta["command"])))
    settings.update(_normalise(parsed.config))
    settings.update(seg.summary_params)
    header = parsed.header
    if "ZERO_STAGE" in header and "zero_stage" not in settings:
        settings["zero_stage"] = header["ZERO_STAGE"]
    if "MODEL" in header and "model" not in settings:
        settings["model"] = header["MODEL"]
    if "GRADIENT_ACCUMULATION_STEPS" in header and "grad_accum" not in settings:
        settings["grad_accum"] = header["GRADIENT_ACCUMULATION_STEPS"]
    world = settings.get("world_size") or header.get("NUM_PROCESSES")
    nodes = header.get("NUM_NODES") if isinstance(header.get("NUM_NODES"), int) else 1
    if isinstance(world, int) and world > 0:
        settings["world_size"] = world
        settings.setdefault("nodes", nodes)
        settings.setdefault("gpus", max(1, world // max(1, nodes)))
    settings.setdefault("grad_accum", 1)
    steps_sorted = seg.smallest
    if steps_sorted and warmup > 0 and len(steps_sorted) > warmup:
        base = 0 if steps_sorted[0] == 0 else 1
        settings["warmup_steps"] = steps_sorted[warmup - 1] + 1 - base
    else:
        settings["warmup_steps"] = 0

    exit_code = meta.get("exit_code")
    status, reason = "done", ""
    if isinstance(exit_code, int) and exit_code != 0:
        status, reason = "failed", f"exit code {exit_code}"
    last = index == len(parsed.segments) - 1
    # a failure clue counts for the run that was going when it appeared: the last one
    if parsed.failure and ((not seg.summary and last) or parsed.jsonl_header):
        status, reason = "failed", parsed.failure

    if seg.count and seg.no_loss == seg.count:
        lossless = f"no usable loss: nan/inf on all {seg.count} step(s)"
        if status == "done":
            status, reason = "failed", lossless
        else:
            reason = f"{reason}; {lossless}"
    notes = [] if seg.summary else ["no closing summary line in the log"]
    if seg.restarts:
        notes.append(f"steps went backwards {seg.restarts} time(s) (a restarted job): the first attempt to log a step wins")
    if seg.repeated:
        notes.append(f"{seg.repeated} repeated step line(s) left out")

    rd = _rundir_of(f, folder)
    revision, repeat = (rd[0], rd[1] - repeat_bases.get(rd[0], 1)) if rd else ("installed", 0)
    tags = {
        "mlflow.parentRunId": parent_id,
        tag_keys.ROLE: tag_keys.ROLE_RUN,
        tag_keys.BATCH: batch,
        tag_keys.CONDITION: condition,
        tag_keys.REVISION: revision,
        tag_keys.REPEAT: str(max(repeat, 0)),
        tag_keys.KIND: "train",
        tag_keys.STATUS: "running",  # until every step is in: see _import_file
        tag_keys.IMPORTED_FROM: str(f),
        tag_keys.MALFORMED_LINES: str(parsed.malformed),
        tag_keys.REPEATED_STEPS: str(seg.repeated),
    }
    if notes:
        tags[tag_keys.NOTE] = "; ".join(notes)
    if meta.get("command"):
        tags[tag_keys.CMD] = str(meta["command"])
    if meta.get("wandb_run") and meta.get("wandb_run") != "unknown":
        tags[tag_keys.WANDB_RUN] = str(meta["wandb_run"])
    for k, v in parsed.versions.items():
        tags[tag_keys.DEEPSPEED_GIT_SHA if k == "deepspeed_git_sha" else tag_keys.version(k)] = v
    jh = parsed.jsonl_header
    if jh:
        for k in ("hostname", "gpu_name", "gpu_count", "device", "deepspeed_git_sha"):
            if jh.get(k) is not None:
                tags[tag_keys.of(k)] = str(jh[k])
        for k, v in (jh.get("versions") or {}).items():
            tags[tag_keys.version(k)] = str(v)
    run_name = condition if tags[tag_keys.REVISION] == "installed" else f"{condition}-{tags[tag_keys.REVISION]}-r{tags[tag_keys.REPEAT]}"
    from dstui.tracking import client as tracking

    tags = {k: tracking.value_text(v)[:MAX_TAG_CHARS] for k, v in tags.items()}
    run = client.create_run(exp_id, run_name=run_name[:250], tags=tags, start_time=start)
    rid = run.info.run_id
    try:
        # through the tracking module, as the supervisor writes: one spelling of values, its chunking, truncation
        tracking.log_params(client, rid, settings)
    except Exception:
        with contextlib.suppress(Exception):
            client.set_terminated(rid, "FAILED")
        raise
    try:
        rel = str(f.relative_to(folder))
    except ValueError:
        rel = f.name
    return ImportedRun(
        source=rel, condition=condition, run_id=rid, steps=seg.count, status=status,
        reason=reason[:MAX_TAG_CHARS], has_summary=bool(seg.summary), revision=revision, repeat=max(repeat, 0),
        repeated=seg.repeated, restarts=seg.restarts, no_loss=seg.no_loss,
    )


def _step_points(rec: dict[str, Any], ts: int) -> list[tuple[str, float, int, int]]:
    """Every numeric field of a (clean) step record at its step, as (key, value, timestamp, step)."""
    step = rec["step"]
    return [(key, value, ts, step) for key, value in metric_values(rec).items()]
