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
"""

from __future__ import annotations

import contextlib
import json
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
PROGRESS_EVERY_S = 3.0
_RUNDIR = re.compile(r"^logs?_(?P<rev>.+)_run(?P<n>\d+)$")


class ImportError_(DstuiError):
    """The folder cannot be imported (missing, empty, already imported)."""


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

    @property
    def steps(self) -> int:
        return sum(r.steps for r in self.runs)

    def summary_text(self) -> str:
        """Human summary for the CLI (and the TUI's notification)."""
        if not self.parent_run_id:
            out = [f"nothing imported from {self.files} file(s); no MLflow run made"]
            out += [f"  skipped {path}: {why}" for path, why in self.skipped]
            out += [f"{self.malformed_lines} malformed line(s) out of {self.lines} lines read"]
            return "\n".join(out)
        out = [
            f"imported {len(self.runs)} run(s), {self.steps} steps, from {self.files} file(s) "
            f"into experiment '{self.experiment}', batch '{self.batch}' (parent run {self.parent_run_id})"
        ]
        for r in self.runs:
            extra = f" ({r.reason})" if r.reason else ""
            note = "" if r.has_summary else ", no summary line"
            out.append(f"  {r.condition}: {r.steps} steps, {r.status}{extra}{note} <- {r.source} [{r.run_id}]")
        for path, why in self.skipped:
            out.append(f"  skipped {path}: {why}")
        out.append(
            f"{self.malformed_lines} malformed line(s) (looked like records, did not parse) "
            f"out of {self.lines} lines read"
        )
        for ex in self.malformed_examples:
            out.append(f"  e.g. {ex}")
        return "\n".join(out)


def _files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    found = [
        p
        for p in root.rglob("*")
        if p.is_file() and (p.suffix in LOG_SUFFIXES or p.name == "metrics.jsonl")
    ]
    # 'x.log' before 'x_detailed.log': the short one is kept when both hold the same steps
    return sorted(found, key=lambda p: (str(p.parent), p.stem.replace("_detailed", ""), len(p.name)))


def _load_metadata(root: Path) -> dict[str, Any]:
    meta = root / "metadata.json"
    if not meta.is_file():
        return {}
    try:
        data = json.loads(meta.read_text(encoding="utf-8"))
    except ValueError:
        # run_batch_enhanced.sh writes it with a heredoc; tolerate its stray commas
        try:
            data = json.loads(re.sub(r",\s*([}\]])", r"\1", meta.read_text(encoding="utf-8")))
        except ValueError:
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
    if not root.exists():
        raise ImportError_(f"{root}: no such file or folder")
    folder = root if root.is_dir() else root.parent
    uri = tracking_uri or paths.tracking_uri()
    client = tracking.client(uri)
    exp_id = tracking.ensure_experiment(client, experiment)
    batch = _batch_id(client, exp_id, f"import-{folder.name}", str(root), force)

    metadata = _load_metadata(folder)
    conditions_meta = metadata.get("conditions") if isinstance(metadata.get("conditions"), dict) else {}
    result = ImportResult(experiment=experiment, batch=batch, parent_run_id="")
    say = _Progress(progress)
    seen: dict[tuple[str, str], str] = {}
    open_runs: list[str] = []  # made by this call and not ended yet: FAILED if it stops half-way
    try:
        for f in _files(root):
            result.files += 1
            say.start(f, f.stat().st_size)
            parsed = parse_log(f, keep_steps=False, progress=say.pass_of("reading"))
            result.lines += parsed.lines
            result.malformed_lines += parsed.malformed
            for ex in parsed.malformed_examples:
                if len(result.malformed_examples) < 5:
                    result.malformed_examples.append(f"{f.name}: {ex}")
            rel = str(f.relative_to(folder)) if f != folder else f.name
            if not parsed.segments:
                result.skipped.append((rel, "no step or summary lines"))
                continue
            sig = (str(f.parent), parsed.signature())
            if parsed.step_count and sig in seen:
                result.skipped.append((rel, f"same steps as {seen[sig]}"))
                continue
            seen[sig] = rel
            if not result.parent_run_id:
                result.parent_run_id = _create_parent(client, exp_id, batch, root, folder, metadata)
                open_runs.append(result.parent_run_id)
            runs = _import_file(client, exp_id, result.parent_run_id, batch, f, folder, parsed, conditions_meta, warmup,
                                say, open_runs)  # fmt: skip
            result.runs.extend(runs)
        if not result.runs and not result.skipped:
            result.skipped.append((str(root), "no log files (*.log, *.txt, *.out, metrics.jsonl)"))
    except BaseException:
        for rid in open_runs:
            with contextlib.suppress(Exception):
                client.set_terminated(rid, "FAILED")
        raise
    if not result.parent_run_id:
        return result  # nothing importable: no MLflow run at all
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    client.log_batch(result.parent_run_id, metrics=[
        Metric("import.runs", float(len(result.runs)), now, 0),
        Metric("import.malformed_lines", float(result.malformed_lines), now, 0),
        Metric("import.lines", float(result.lines), now, 0),
    ])
    client.set_terminated(result.parent_run_id, "FINISHED")
    return result


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
    if (folder / "metadata.json").is_file():
        client.log_artifact(parent.info.run_id, str(folder / "metadata.json"), artifact_path="import")
    return parent.info.run_id


def _import_file(
    client: Any, exp_id: str, parent_id: str, batch: str, f: Path, folder: Path, parsed: ParsedLog,
    conditions_meta: dict[str, Any], warmup: int, say: _Progress, open_runs: list[str],
) -> list[ImportedRun]:
    """One child run per segment of the file: made first, then the file's steps streamed into them."""
    from dstui.tracking import client as tracking

    start = int(f.stat().st_mtime * 1000)
    made = []
    for i, seg in enumerate(parsed.segments):
        run = _log_segment(client, exp_id, parent_id, batch, f, folder, parsed, seg, i, conditions_meta, warmup, start)
        open_runs.append(run.run_id)
        made.append(run)
    sender = _StepSender(client, [r.run_id for r in made], start)
    again = parse_log(f, keep_steps=False, on_step=sender.add, progress=say.pass_of("sending"))
    sender.flush()
    now = int(time.time() * 1000)
    for run, seg, sent in zip(made, again.segments, sender.counts, strict=False):
        metrics = [(f"summary.{k}", float(v), now, 0) for k, v in seg.summary.items() if _is_num(v)]
        if sent and "summary.steps" not in {m[0] for m in metrics}:
            metrics.append(("summary.steps", float(sent), now, 0))
        tracking.log_metrics(client, run.run_id, metrics)
        if f.stat().st_size <= MAX_ARTIFACT_BYTES:
            client.log_artifact(run.run_id, str(f), artifact_path="run")
        tracking.set_tags(client, run.run_id, {tag_keys.IMPORTED_STEPS: sent})
        client.set_terminated(run.run_id, "FINISHED" if run.status == "done" else "FAILED", end_time=start)
        open_runs.remove(run.run_id)
    return made


class _StepSender:
    """Steps of a file's segments into their MLflow runs, a log_batch at a time (bounded memory)."""

    def __init__(self, client: Any, run_ids: list[str], start_ms: int) -> None:
        self.client, self.run_ids, self.start_ms = client, run_ids, start_ms
        self.counts = [0] * len(run_ids)
        self.pending: list[tuple[str, float, int, int]] = []
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
        if len(self.pending) >= SEND_POINTS:
            self.flush()

    def flush(self) -> None:
        from dstui.tracking import client as tracking

        if self.pending:
            tracking.log_metrics(self.client, self.run_ids[self.pending_run], self.pending)
            self.pending = []


def _batch_id(client: Any, exp_id: str, base: str, source: str, force: bool) -> str:
    """``import-<folder>``; refuses a second import of the same path unless forced."""
    filt = f"{tag_keys.BATCH_FILTER} and {tag_keys.search(tag_keys.BATCH)} LIKE '{base.replace(chr(39), '')}%'"
    existing = client.search_runs([exp_id], filter_string=filt, max_results=1000)
    taken = {r.data.tags.get(tag_keys.BATCH) for r in existing}
    for r in existing:
        if r.data.tags.get(tag_keys.IMPORTED_FROM) == source:
            if not force:
                raise ImportError_(
                    f"{source} was already imported as batch '{r.data.tags.get(tag_keys.BATCH)}' "
                    f"(parent run {r.info.run_id}); use --force to replace it"
                )
            _delete_batch(client, exp_id, r)
            taken.discard(r.data.tags.get(tag_keys.BATCH))
    batch, n = base, 1
    while batch in taken:
        n += 1
        batch = f"{base}-{n}"
    return batch


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
            if p.is_file():
                try:
                    cond = json.loads(p.read_text()).get("condition")
                except (ValueError, AttributeError):
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
) -> ImportedRun:
    """The child run of one segment: tags and params (its steps are sent by :class:`_StepSender`)."""
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
    settings["steps"] = seg.count

    exit_code = meta.get("exit_code")
    status, reason = "done", ""
    if isinstance(exit_code, int) and exit_code != 0:
        status, reason = "failed", f"exit code {exit_code}"
    last = index == len(parsed.segments) - 1
    # a failure clue counts for the run that was going when it appeared: the last one
    if parsed.failure and ((not seg.summary and last) or parsed.jsonl_header):
        status, reason = "failed", parsed.failure

    rev_match = _RUNDIR.match(f.parent.name) if f.parent != folder else None
    tags = {
        "mlflow.parentRunId": parent_id,
        tag_keys.ROLE: tag_keys.ROLE_RUN,
        tag_keys.BATCH: batch,
        tag_keys.CONDITION: condition,
        tag_keys.REVISION: rev_match.group("rev") if rev_match else "installed",
        tag_keys.REPEAT: str(int(rev_match.group("n")) - 1) if rev_match else "0",
        tag_keys.KIND: "train",
        tag_keys.STATUS: status,
        tag_keys.REASON: reason,
        tag_keys.IMPORTED_FROM: str(f),
        tag_keys.MALFORMED_LINES: str(parsed.malformed),
    }
    if not seg.summary:
        tags[tag_keys.NOTE] = "no closing summary line in the log"
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
        reason=reason, has_summary=bool(seg.summary),
    )


def _step_points(rec: dict[str, Any], ts: int) -> list[tuple[str, float, int, int]]:
    """Every numeric field of a (clean) step record at its step, as (key, value, timestamp, step)."""
    step = rec["step"]
    return [(key, value, ts, step) for key, value in metric_values(rec).items()]
