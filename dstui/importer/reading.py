"""The reading side of an import: which files, what each segment of a log is, named and judged.

Nothing here talks to MLflow. :func:`walk` finds the logs (and what could not be
read), :func:`load_metadata` reads seed 001's ``metadata.json``, and
:func:`plan_segment` turns one segment of a parsed log (:mod:`~dstui.importer.parse`)
into a :class:`SegmentRun`: its condition, revision and repeat, its settings
(the params), whether it ended well and why not, and the import's own tags. The
writer (:mod:`~dstui.importer.seedlogs`, through :mod:`dstui.tracking.layout`)
makes the MLflow runs of them.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dstui.importer.names import normalise, params_from_command, params_from_name
from dstui.importer.parse import ParsedLog, Segment
from dstui.tracking import tags as tag_keys

LOG_SUFFIXES = (".log", ".txt", ".out")
MAX_TAG_CHARS = 5000  # MLflow keeps 8000 characters of a tag value
PROGRESS_EVERY_S = 3.0
SHOW_NOTES = 30  # revisions whose run numbering is described, at most
_RUNDIR = re.compile(r"^logs?_(?P<rev>.+)_run(?P<n>\d+)$")


def why(e: OSError) -> str:
    """``permission denied``: what the system said, as a reason a user reads."""
    return (e.strerror or type(e).__name__).lower()


def rel(p: Path, folder: Path) -> str:
    """A path as the summary names it: below the imported folder, else its name."""
    try:
        return str(p.relative_to(folder)) if p != folder else p.name
    except ValueError:
        return p.name


def walk(root: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
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
            unreadable.append((folder, why(e)))
            continue
        for entry in entries:
            p = Path(entry.path)
            try:
                if entry.is_dir(follow_symlinks=False):
                    todo.append(p)
                elif entry.is_file() and (p.suffix in LOG_SUFFIXES or p.name == "metrics.jsonl"):
                    found.append(p)
            except OSError as e:
                unreadable.append((p, why(e)))
    # 'x.log' before 'x_detailed.log': the short one is kept when both hold the same steps
    found.sort(key=lambda p: (str(p.parent), p.stem.replace("_detailed", ""), len(p.name)))
    return found, sorted(unreadable)


def nothing_readable(root: Path, unreadable: list[tuple[Path, str]]) -> str:
    """One line: the first unreadable path and its reason stand for all of them."""
    first, reason = unreadable[0]
    more = f" and {len(unreadable) - 1} more" if len(unreadable) > 1 else ""
    return f"{root}: nothing readable to import: {first} ({reason}){more}"


def load_metadata(root: Path, skipped: list[tuple[str, str]]) -> dict[str, Any]:
    """Seed 001's ``metadata.json`` (condition names, commands, exit codes, wandb ids), or {}."""
    meta = root / "metadata.json"
    try:
        if not meta.is_file():
            return {}
        text = meta.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        skipped.append((meta.name, why(e)))
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


class Progress:
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


def rundir_of(f: Path, folder: Path) -> tuple[str, int] | None:
    """(revision, N) of a log in a ``logs_<rev>_runN`` folder below the imported one."""
    m = _RUNDIR.match(f.parent.name) if f.parent != folder else None
    return (m.group("rev"), int(m.group("n"))) if m else None


def repeat_bases(files: list[Path], folder: Path) -> tuple[dict[str, int], list[str]]:
    """Per revision, the N of ``logs_<rev>_runN`` that is repeat 0, and a line saying so.

    The seeds' compare_revisions.sh numbers its runs from 1 (``logs_main_run1``); a folder
    set that has a ``run0`` is taken as numbered from 0. Never a negative repeat.
    """
    numbers: dict[str, set[int]] = {}
    for f in files:
        rd = rundir_of(f, folder)
        if rd:
            numbers.setdefault(rd[0], set()).add(rd[1])
    bases = {rev: (0 if min(ns) == 0 else 1) for rev, ns in numbers.items()}
    notes = [
        f"revision {rev}: folders run{min(ns)}..run{max(ns)} taken as numbered from {bases[rev]} "
        f"(repeats {min(ns) - bases[rev]}..{max(ns) - bases[rev]})"
        for rev, ns in sorted(numbers.items())[:SHOW_NOTES]
    ]
    return bases, notes


def condition_name(f: Path, metadata_conditions: dict[str, Any]) -> str:
    """A log's condition: its name in metadata.json, a run folder's ``condition``, or the file's stem."""
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


@dataclass
class Folder:
    """What every log of one import shares: where it is, seed 001's metadata, the warm-up, the run numbering."""

    path: Path  # the imported folder (a file's own folder when one file is imported)
    conditions: dict[str, Any] = field(default_factory=dict)  # metadata.json's "conditions"
    warmup: int = 1
    repeat_bases: dict[str, int] = field(default_factory=dict)


@dataclass
class SegmentRun:
    """One run to import: a segment of a log, named and judged; the writer makes its MLflow run."""

    name: str  # the MLflow run's name
    condition: str
    revision: str
    repeat: int
    settings: dict[str, Any]  # its params
    status: str  # done | failed
    reason: str
    source: str  # the log, below the imported folder
    tags: dict[str, Any]  # what the import adds to the layout's tags: where from, lines left out, ...
    has_summary: bool
    count: int
    repeated: int
    restarts: int
    no_loss: int


def plan_segment(ctx: Folder, f: Path, parsed: ParsedLog, index: int) -> SegmentRun:
    """The run of segment ``index`` of the log ``f``: see :class:`SegmentRun`."""
    seg = parsed.segments[index]
    condition = condition_name(f, ctx.conditions)
    meta = ctx.conditions.get(condition, {}) if isinstance(ctx.conditions.get(condition), dict) else {}
    if len(parsed.segments) > 1:
        condition = f"{condition}-{index}"
    rd = rundir_of(f, ctx.path)
    revision, repeat = (rd[0], max(rd[1] - ctx.repeat_bases.get(rd[0], 1), 0)) if rd else ("installed", 0)
    status, reason = segment_outcome(meta, parsed, seg, last=index == len(parsed.segments) - 1)
    name = condition if revision == "installed" else f"{condition}-{revision}-r{repeat}"
    return SegmentRun(
        name=name[:250], condition=condition, revision=revision, repeat=repeat,
        settings=segment_settings(f, meta, parsed, seg, ctx.warmup), status=status, reason=reason[:MAX_TAG_CHARS],
        source=rel(f, ctx.path), tags=segment_tags(f, meta, parsed, seg), has_summary=bool(seg.summary),
        count=seg.count, repeated=seg.repeated, restarts=seg.restarts, no_loss=seg.no_loss,
    )  # fmt: skip


def segment_settings(f: Path, meta: dict[str, Any], parsed: ParsedLog, seg: Segment, warmup: int) -> dict[str, Any]:
    """A segment's settings under dstui's names; weakest to strongest: file name, metadata command,
    Namespace dump, summary line, then the run.sh header for what is still missing."""
    settings: dict[str, Any] = {}
    settings.update(params_from_name(f.stem))
    if meta.get("command"):
        settings.update(params_from_command(str(meta["command"])))
    settings.update(normalise(parsed.config))
    settings.update(seg.summary_params)
    header = parsed.header
    for key, name in (("ZERO_STAGE", "zero_stage"), ("MODEL", "model"), ("GRADIENT_ACCUMULATION_STEPS", "grad_accum")):
        if key in header and name not in settings:
            settings[name] = header[key]
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
    return settings


def segment_outcome(meta: dict[str, Any], parsed: ParsedLog, seg: Segment, *, last: bool) -> tuple[str, str]:
    """(done | failed, why): metadata's exit code, a failure clue in the log, or no usable loss at all."""
    exit_code = meta.get("exit_code")
    status, reason = "done", ""
    if isinstance(exit_code, int) and exit_code != 0:
        status, reason = "failed", f"exit code {exit_code}"
    # a failure clue counts for the run that was going when it appeared: the last one
    if parsed.failure and ((not seg.summary and last) or parsed.jsonl_header):
        status, reason = "failed", parsed.failure
    if seg.count and seg.no_loss == seg.count:
        lossless = f"no usable loss: nan/inf on all {seg.count} step(s)"
        if status == "done":
            status, reason = "failed", lossless
        else:
            reason = f"{reason}; {lossless}"
    return status, reason


def segment_tags(f: Path, meta: dict[str, Any], parsed: ParsedLog, seg: Segment) -> dict[str, Any]:
    """The import's own tags of a run: where it came from, what was left out, versions and host it ran on."""
    notes = [] if seg.summary else ["no closing summary line in the log"]
    if seg.restarts:
        notes.append(f"steps went backwards {seg.restarts} time(s) (a restarted job): the first attempt to log a step wins")
    if seg.repeated:
        notes.append(f"{seg.repeated} repeated step line(s) left out")
    tags: dict[str, Any] = {
        tag_keys.IMPORTED_FROM: str(f),
        tag_keys.MALFORMED_LINES: parsed.malformed,
        tag_keys.REPEATED_STEPS: seg.repeated,
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
    return tags
