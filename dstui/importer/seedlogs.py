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

A log becomes one MLflow run per closing summary line (a log holding several
runs is split there; steps after the last summary form a run of their own,
usually one that crashed). Every folder gets a batch run tagged
``dstui.role=batch``, ``dstui.batch=import-<folder name>``, so reports work on
imports exactly as on launched batches: the runs are opened, tagged and ended
through :mod:`dstui.tracking.layout`, as the supervisor's are. Reading the
files is :mod:`~dstui.importer.reading` (and :mod:`~dstui.importer.parse`);
this module writes what it read. Lines that look like records but do not
parse are counted and reported, never fatal.

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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dstui.core.errors import DstuiError
from dstui.core.records import metric_values
from dstui.importer.parse import ParsedLog, is_number, parse_log
from dstui.importer.reading import (
    MAX_TAG_CHARS,
    Folder,
    Progress,
    SegmentRun,
    load_metadata,
    nothing_readable,
    plan_segment,
    rel,
    repeat_bases,
    walk,
    why,
)
from dstui.importer.result import ImportedRun, ImportResult
from dstui.tracking import layout
from dstui.tracking import tags as tag_keys

MAX_ARTIFACT_BYTES = 50 << 20
SEND_POINTS = 1000  # points per MLflow call (tracking.MAX_BATCH)
INTERRUPTED = "import interrupted"


class ImportError_(DstuiError):
    """The folder cannot be imported (missing, unreadable, already imported)."""


class ImportInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during an import, once its partial runs are marked: says what to run again."""


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
    be imported: a folder with nothing importable leaves no batch run, and every run
    this call made ends FINISHED, FAILED or KILLED, also when it stops half-way.
    """
    from dstui.core import paths
    from dstui.tracking import chart_view
    from dstui.tracking import client as tracking

    root = _existing(path)
    folder = root if root.is_dir() else root.parent
    files, unreadable = walk(root)
    if not files and unreadable:
        raise ImportError_(nothing_readable(root, unreadable))
    client = tracking.client(tracking_uri or paths.tracking_uri())
    exp_id = chart_view.set_up(client, experiment)  # the dstui view, where the experiment has none yet
    batch, replaced = _batch_id(client, exp_id, f"import-{folder.name}", str(root), force)
    result = ImportResult(experiment=experiment, batch=batch, parent_run_id="", replaced=replaced)
    result.unreadable = len(unreadable)
    result.skipped += [(rel(p, folder), reason) for p, reason in unreadable]
    metadata = load_metadata(folder, result.skipped)
    conditions = metadata.get("conditions") if isinstance(metadata.get("conditions"), dict) else {}
    bases, result.repeat_notes = repeat_bases(files, folder)
    job = _Import(client, exp_id, root, Folder(folder, conditions, warmup, bases), result, metadata, Progress(progress))
    try:
        read = job.run(files, unreadable)
    except BaseException as e:
        job.mark_stopped(e)
        if isinstance(e, KeyboardInterrupt) and job.batch_run:
            raise ImportInterrupted(
                f"import interrupted: batch '{batch}' (batch run {job.batch_run}) holds what was imported so far, "
                f"its runs marked killed ({INTERRUPTED}); run the same `dstui import {root} --experiment "
                f"{experiment}` again to replace it (no --force needed)"
            ) from e
        raise
    if not read and unreadable:
        raise ImportError_(nothing_readable(root, unreadable))
    if not result.runs and not result.skipped:
        result.skipped.append((str(root), "no log files (*.log, *.txt, *.out, metrics.jsonl)"))
    if result.parent_run_id:  # nothing importable: no MLflow run at all
        job.end_batch()
    return result


def _existing(path: str | Path) -> Path:
    root = Path(path).expanduser().resolve()
    try:
        root.stat()
    except FileNotFoundError:
        raise ImportError_(f"{root}: no such file or folder") from None
    except OSError as e:
        raise ImportError_(f"{root}: cannot be read ({why(e)})") from None
    return root


@dataclass
class _Import:
    """One import under way: the MLflow runs it made, and what they hold so far (what an interruption marks)."""

    client: Any
    exp_id: str
    root: Path
    ctx: Folder
    result: ImportResult
    metadata: dict[str, Any]
    say: Progress
    batch_run: str = ""
    open_runs: dict[str, int] = field(default_factory=dict)  # run id -> steps MLflow holds of it
    seen: dict[tuple[str, str], str] = field(default_factory=dict)  # (folder, steps) -> the file that had them

    def run(self, files: list[Path], unreadable: list[tuple[Path, str]]) -> int:
        """Read and import every file; the number of files that could be read."""
        read = 0
        for f in files:
            self.result.files += 1
            parsed = self.read(f, unreadable)
            if parsed is None:
                continue
            read += 1
            if self.importable(f, parsed):
                if not self.batch_run:
                    self.batch_run = self.result.parent_run_id = self.open_batch()
                self.result.runs.extend(self.import_file(f, parsed))
        return read

    def read(self, f: Path, unreadable: list[tuple[Path, str]]) -> ParsedLog | None:
        """The first pass over a file (what it holds); None when it cannot be read, said in the result."""
        r = self.result
        try:
            self.say.start(f, f.stat().st_size)
            parsed = parse_log(f, keep_steps=False, progress=self.say.pass_of("reading"))
        except OSError as e:
            r.unreadable += 1
            unreadable.append((f, why(e)))
            r.skipped.append((rel(f, self.ctx.path), why(e)))
            return None
        r.lines += parsed.lines
        r.malformed_lines += parsed.malformed
        r.partial_lines += parsed.partial
        for ex in parsed.malformed_examples:
            if len(r.malformed_examples) < 5:
                r.malformed_examples.append(f"{f.name}: {ex}")
        return parsed

    def importable(self, f: Path, parsed: ParsedLog) -> bool:
        """Steps or a summary, and not the same steps as a file beside it (``x.log`` and ``x_detailed.log``)."""
        where = rel(f, self.ctx.path)
        if not parsed.segments:
            self.result.skipped.append((where, "no step or summary lines"))
            return False
        sig = (str(f.parent), parsed.signature())
        if parsed.step_count and sig in self.seen:
            self.result.skipped.append((where, f"same steps as {self.seen[sig]}"))
            return False
        self.seen[sig] = where
        return True

    def open_batch(self) -> str:
        """The batch's run, made when the first file turned out importable."""
        extra: dict[str, Any] = {tag_keys.IMPORTED_FROM: str(self.root)}
        if self.metadata.get("experiment_date"):
            extra[tag_keys.EXPERIMENT_DATE] = str(self.metadata["experiment_date"])[:250]
        run = layout.BatchRun(batch=self.result.batch, runs=0, extra=extra,
                              description=f"Batch `{self.result.batch}` imported from `{self.root}`.")  # fmt: skip
        rid = layout.open_batch(self.client, self.exp_id, run)
        if self.metadata:
            with contextlib.suppress(OSError):  # gone or unreadable since it was read: the import goes on
                self.client.log_artifact(rid, str(self.ctx.path / "metadata.json"), artifact_path="import")
        return rid

    def import_file(self, f: Path, parsed: ParsedLog) -> list[ImportedRun]:
        """One run per segment of the file: made first, then the file's steps streamed into them.

        A file that cannot be read the second time (gone, permissions changed) fails its runs
        with why; the import goes on."""
        try:
            start = f.stat().st_mtime
        except OSError:  # read a moment ago; reading it again says what became of it
            start = time.time()
        planned = [plan_segment(self.ctx, f, parsed, i) for i in range(len(parsed.segments))]
        ids = [self.open_run(seg, start) for seg in planned]
        sender = _StepSender(self.client, ids, int(start * 1000), self.open_runs)
        broken = ""
        try:
            segments = parse_log(f, keep_steps=False, on_step=sender.add, progress=self.say.pass_of("sending")).segments
        except OSError as e:
            segments, broken = [], f"log could not be read again: {why(e)}"
        sender.flush()
        made = []
        for i, (seg, rid) in enumerate(zip(planned, ids, strict=True)):
            summary = segments[i].summary if i < len(segments) else {}
            made.append(self.end_run(f, seg, rid, summary, start, broken))
        return made

    def open_run(self, seg: SegmentRun, start_s: float) -> str:
        """A segment's run: its ``dstui.status`` stays ``running`` and its ``steps`` param unset until every
        step is in MLflow (:meth:`end_run`), so no partial import ever reads as done."""
        hostname = seg.tags.get(tag_keys.HOSTNAME)  # where it ran, when the log says: not this machine
        run = layout.ChildRun(
            name=seg.name, batch=self.result.batch, condition=seg.condition, revision=seg.revision,
            repeat=seg.repeat, kind="train", state="running", source=seg.source,
            description=f"Run `{seg.name}` of batch `{self.result.batch}`, imported from `{seg.source}`.",
            color=len(self.open_runs) + len(self.result.runs), extra={**seg.tags, tag_keys.HOSTNAME: hostname},
        )  # fmt: skip
        rid = layout.open_child(self.client, self.exp_id, run, start_s=start_s)
        self.open_runs[rid] = 0
        try:  # through the layout, as the supervisor writes: one spelling of values, its chunking, truncation
            from dstui.tracking import client as tracking

            tracking.log_params(self.client, rid, seg.settings)
            layout.log_dataset(self.client, rid, seg.settings)
        except Exception:
            with contextlib.suppress(Exception):
                layout.end_run(self.client, rid, "failed", ended_s=start_s)
            self.open_runs.pop(rid, None)
            raise
        return rid

    def end_run(self, f: Path, seg: SegmentRun, rid: str, summary: dict[str, Any], start_s: float, broken: str) -> ImportedRun:
        """The run's summary metrics, the log as an artifact, ``steps`` and its end (at the log's time)."""
        from dstui.tracking import client as tracking

        sent = self.open_runs[rid]
        now = int(time.time() * 1000)
        metrics = [(f"summary.{k}", float(v), now, 0) for k, v in summary.items() if is_number(v)]
        if sent and "summary.steps" not in {m[0] for m in metrics}:
            metrics.append(("summary.steps", float(sent), now, 0))
        layout.log_points(self.client, rid, metrics)
        status, reason = ("failed", broken) if broken else (seg.status, seg.reason)
        with contextlib.suppress(OSError):  # the log itself is a convenience; its steps are in MLflow
            if f.stat().st_size <= MAX_ARTIFACT_BYTES:
                self.client.log_artifact(rid, str(f), artifact_path="run")
        tracking.log_params(self.client, rid, {"steps": sent})
        layout.end_run(self.client, rid, status, ended_s=start_s,
                       tags={tag_keys.IMPORTED_STEPS: sent, tag_keys.REASON: reason})  # fmt: skip
        del self.open_runs[rid]
        return ImportedRun(
            source=seg.source, condition=seg.condition, run_id=rid, steps=sent, status=status, reason=reason,
            has_summary=seg.has_summary, revision=seg.revision, repeat=seg.repeat, repeated=seg.repeated,
            restarts=seg.restarts, no_loss=seg.no_loss,
        )  # fmt: skip

    def end_batch(self) -> None:
        """The batch run's counts and end (a batch run holds no metrics: they would put it in every chart)."""
        r = self.result
        counts = {tag_keys.RUNS: len(r.runs), tag_keys.MALFORMED_LINES: r.malformed_lines,
                  tag_keys.IMPORTED_LINES: r.lines, tag_keys.UNREADABLE: r.unreadable}  # fmt: skip
        layout.end_batch(self.client, r.parent_run_id, [run.status for run in r.runs], tags=counts)

    def mark_stopped(self, e: BaseException) -> None:
        """End the runs an import leaves half-done as what they are: partial, with the steps they hold."""
        from dstui.tracking import client as tracking

        state = "killed" if isinstance(e, KeyboardInterrupt) else "failed"
        reason = INTERRUPTED if state == "killed" else f"{INTERRUPTED} by an error: {type(e).__name__}: {e}"[:MAX_TAG_CHARS]
        for rid, stored in list(self.open_runs.items()):
            with contextlib.suppress(Exception):
                tracking.log_params(self.client, rid, {"steps": stored})
            with contextlib.suppress(Exception):
                layout.end_run(self.client, rid, state, tags={tag_keys.REASON: reason, tag_keys.IMPORTED_STEPS: stored})
        if self.batch_run:
            with contextlib.suppress(Exception):
                layout.end_run(self.client, self.batch_run, state, tags={tag_keys.REASON: reason})


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
        step = rec["step"]
        self.pending.extend((key, value, ts, step) for key, value in metric_values(rec).items())
        self.pending_steps += 1
        if len(self.pending) >= SEND_POINTS:
            self.flush()

    def flush(self) -> None:
        if self.pending_steps:
            run_id = self.run_ids[self.pending_run]
            layout.log_points(self.client, run_id, self.pending)
            self.stored[run_id] = self.stored.get(run_id, 0) + self.pending_steps
        self.pending, self.pending_steps = [], 0


def _batch_id(client: Any, exp_id: str, base: str, source: str, force: bool) -> tuple[str, str]:
    """(``import-<folder>``, what it replaced); refuses a second import of the same path unless forced.

    An import that did not finish (its batch run ended with reason ``import interrupted``:
    Ctrl-C, or stopped by an error) is no import to protect: it is replaced without
    ``--force``. One still RUNNING may be an import going on now, so that one needs
    ``--force``. (The batch run's status says how its runs went, as a launched batch's.)
    """
    filt = f"{tag_keys.BATCH_FILTER} and {tag_keys.search(tag_keys.BATCH)} LIKE '{base.replace(chr(39), '')}%'"
    existing = client.search_runs([exp_id], filter_string=filt, max_results=1000)
    taken = {r.data.tags.get(tag_keys.BATCH) for r in existing}
    replaced = ""
    for r in existing:
        if r.data.tags.get(tag_keys.IMPORTED_FROM) != source:
            continue
        old = r.data.tags.get(tag_keys.BATCH)
        partial = r.info.status != "RUNNING" and r.data.tags.get(tag_keys.REASON, "").startswith(INTERRUPTED)
        if not force and not partial:
            if r.info.status == "RUNNING":
                raise ImportError_(
                    f"{source} is being imported as batch '{old}' (batch run {r.info.run_id} is still running), "
                    "or that import was killed outright; use --force to replace it"
                )
            raise ImportError_(
                f"{source} was already imported as batch '{old}' (batch run {r.info.run_id}); use --force to replace it"
            )
        _delete_batch(client, exp_id, r)
        taken.discard(old)
        what = "the interrupted import" if partial else "the earlier import"
        replaced = f"{what} batch '{old}' (batch run {r.info.run_id}, now deleted)"
    batch, n = base, 1
    while batch in taken:
        n += 1
        batch = f"{base}-{n}"
    return batch, replaced


def _delete_batch(client: Any, exp_id: str, batch_run: Any) -> None:
    """A batch's runs (its tag; older imports nested them under the batch run too) and the batch run."""
    from dstui.tracking import client as tracking

    lit = tracking.literal(batch_run.data.tags.get(tag_keys.BATCH, ""))
    filt = f"{tag_keys.RUN_FILTER} and {tag_keys.search(tag_keys.BATCH)} = {lit}" if lit else None
    nested = f"{tag_keys.search(tag_keys.PARENT)} = '{batch_run.info.run_id}'"
    for f in (filt, nested):
        for child in client.search_runs([exp_id], filter_string=f, max_results=10000) if f else []:
            with contextlib.suppress(Exception):  # found by both filters: deleted once already
                client.delete_run(child.info.run_id)
    client.delete_run(batch_run.info.run_id)
