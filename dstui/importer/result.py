"""What an import did: the runs it made, the files it skipped and why, the lines it could not read.

:class:`ImportResult` is what :func:`dstui.importer.seedlogs.import_dir` returns and
``dstui import`` prints (:meth:`ImportResult.summary_text`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

SHOW_SKIPPED = 30  # skipped files listed by name in the summary (the rest counted)


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
