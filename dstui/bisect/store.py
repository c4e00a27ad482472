"""What a bisect keeps on disk, so that a killed bisect continues where it stopped.

::

    <runs>/bisect/<experiment>-<condition>-<settings key>/     one store per condition
        commits/<sha>.json      what is known of a commit: its env build, its batches, its run samples
        commits/pypi-<v>.json   the same for a PyPI release (the release walk)
        <good>-<bad>-<metric>/  one search over a range (releases by version: 0.16.0-0.18.0-verdict)
            progress.json       where the search stands (the CLI and the TUI's runs screen read it)
            report.md           the report section

A commit's results belong to the condition, not to one search: a second
bisect of the same condition over an overlapping range reuses them, and a
restarted one never builds or runs a commit again. The search itself keeps no
state of its own: it is replayed from these records on every start.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dstui.analysis.revision_compare import RunSample
from dstui.core.rundir import read_json, write_json_atomic
from dstui.spec.settings import Settings

PROGRESS = "progress.json"


def settings_key(settings: Settings) -> str:
    """Stable key of a condition's settings: results of another condition are never mixed in."""
    blob = json.dumps(settings.model_dump(mode="json"), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


@dataclass
class CommitRecord:
    """Everything measured on one commit, in the order it happened."""

    sha: str
    subject: str = ""
    build: str = ""  # "" (not yet) | "ok" | "failed"
    build_error: str = ""
    builds: int = 0  # envs this bisect built for it (a cached env counts 0)
    version: str = ""
    batches: list[str] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)

    def run_samples(self) -> list[RunSample]:
        return [
            RunSample("c", self.sha, s.get("iter_time_mean"), s.get("mem_peak"),
                      {int(k): float(v) for k, v in (s.get("loss") or {}).items()}, bool(s.get("usable")))
            for s in self.samples
        ]  # fmt: skip

    def runs_done(self) -> int:
        return len(self.samples)


class Store:
    """The folder of one condition's bisect results."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "commits").mkdir(parents=True, exist_ok=True)

    @classmethod
    def for_condition(cls, runs_root: Path, experiment: str, condition: str, settings: Settings) -> Store:
        return cls(runs_root / "bisect" / f"{experiment}-{condition}-{settings_key(settings)}")

    def _commit_file(self, sha: str) -> Path:
        return self.root / "commits" / f"{sha}.json"

    def commit(self, sha: str, subject: str = "") -> CommitRecord:
        data = read_json(self._commit_file(sha), None)
        if not isinstance(data, dict):
            return CommitRecord(sha, subject)
        rec = CommitRecord(**{k: v for k, v in data.items() if k in CommitRecord.__dataclass_fields__})
        rec.subject = rec.subject or subject
        return rec

    def save(self, rec: CommitRecord) -> None:
        write_json_atomic(self._commit_file(rec.sha), {**asdict(rec), "updated": time.time()})

    def session_dir(self, good: str, bad: str, metric: str) -> Path:
        """``<good>-<bad>-<metric>``: shas cut to 10, releases (``pypi-0.18.0``) by version, odd characters as _."""
        def short(key: str) -> str:
            return key.removeprefix("pypi-")[:24] if key.startswith("pypi-") else key[:10]

        name = re.sub(r"[^A-Za-z0-9_.+-]", "_", f"{short(good)}-{short(bad)}-{metric}")[:120]
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path


def write_progress(session: Path, progress: dict[str, Any]) -> None:
    write_json_atomic(session / PROGRESS, {**progress, "updated": time.time()})


def list_progress(runs_root: Path) -> list[dict[str, Any]]:
    """Every bisect's progress, newest first (for the TUI)."""
    found = []
    for p in (runs_root / "bisect").glob(f"*/*/{PROGRESS}"):
        data = read_json(p, None)
        if isinstance(data, dict):
            found.append({**data, "folder": str(p.parent)})
    return sorted(found, key=lambda d: d.get("updated", 0), reverse=True)
