"""The bisect loop: measure the good commit, halve the range, step around skips, conclude.

Nothing of the search is stored: on every start it is replayed from the
per-commit records (:mod:`dstui.bisect.store`), which makes a killed bisect
continue exactly where it stopped and never build or run a commit twice.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dstui.bisect import report
from dstui.bisect.decide import UNDECIDED, Decision, decide
from dstui.bisect.measure import Measurer
from dstui.bisect.search import SKIP, Conclusion, conclude, next_index
from dstui.bisect.store import CommitRecord, write_progress
from dstui.core.errors import DstuiError
from dstui.revisions.history import Commit


def build_summary(error: str) -> str:
    """The first line of a build error, then the cause from the log's tail.

    pip quotes a failing setup.py between "[N lines of output]" and "[end of
    output]": its last line is the cause; otherwise the last line naming an error.
    """
    lines = [ln.strip() for ln in error.splitlines() if ln.strip()]
    if not lines:
        return "unknown error"
    first = lines[0].split(" (Command ")[0]
    ends = [i for i, ln in enumerate(lines) if ln == "[end of output]" and i > 1]
    cause = lines[ends[-1] - 1] if ends else next((ln for ln in reversed(lines[1:]) if "error" in ln.lower()), "")
    return f"{first}: {cause}"[:300] if cause else first[:300]


@dataclass(frozen=True)
class Options:
    metric: str
    threshold: float  # relative: 0.05 = 5%
    loss_tol: float
    repeats: int
    max_repeats: int


@dataclass
class Tested:
    index: int  # -1 = the good commit
    commit: Commit
    decision: Decision
    record: CommitRecord

    def row(self) -> dict[str, Any]:
        return {
            "index": self.index, "sha": self.commit.sha, "subject": self.commit.subject,
            "verdict": self.decision.verdict, "why": self.decision.why, "change": self.decision.change,
            "runs": self.record.runs_done(), "batches": list(self.record.batches),
            "build": self.record.build, "build_error": self.record.build_error, "builds": self.record.builds,
        }  # fmt: skip


@dataclass
class Outcome:
    """The answer: the first bad commit, none, or the suspects skips leave."""

    conclusion: Conclusion
    line: list[Commit]
    tested: dict[int, Tested] = field(default_factory=dict)

    @property
    def first_bad(self) -> Commit | None:
        i = self.conclusion.first_bad
        return self.line[i] if i is not None and i < len(self.line) else None

    @property
    def regression(self) -> bool | None:
        """True: a first bad commit; False: no regression; None: ambiguous (skips)."""
        if self.conclusion.first_bad is None:
            return None
        return self.conclusion.first_bad < len(self.line)

    def answer(self) -> str:
        bad = self.first_bad
        if bad is not None:
            t = self.tested[self.conclusion.first_bad or 0]
            return f"first bad commit: {bad.short} {bad.subject!r}: {t.decision.change}"
        if self.regression is False:
            return "no regression found between good and bad"
        names = ", ".join(f"{self.line[i].short} {self.line[i].subject!r}" for i in self.conclusion.suspects)
        maybe_none = "" if self.conclusion.hi < len(self.line) else " (or no regression)"
        return f"the first bad commit could not be isolated: it is one of {names}{maybe_none}"


class Bisect:
    """One search over ``good..bad`` (the first-parent ``line``, oldest first, ending at bad)."""

    def __init__(self, measurer: Measurer, good: Commit, line: list[Commit], options: Options, session: Path,
                 say: Callable[[str], None] = print, tag: Callable[[Tested, str], None] | None = None) -> None:  # fmt: skip
        self.m, self.good, self.line, self.o = measurer, good, line, options
        self.session, self.say, self.tag = session, say, tag
        self.base: CommitRecord = measurer.store.commit(good.sha, good.subject)
        self._shown: tuple[tuple[int, Commit] | None, dict[int, Tested]] = (None, {})
        # the progress file names the batch of the commit under test as soon as it exists
        measurer.on_batch = lambda rec: self._progress("running", *self._shown)

    # -- verdicts from what is on disk ------------------------------------------------

    def decision(self, rec: CommitRecord) -> Decision | None:
        """The verdict the records support now; None when the commit still needs runs."""
        if rec.build == "failed":
            return Decision(SKIP, f"does not build: {build_summary(rec.build_error)}")
        if not rec.samples or rec.runs_done() < self.o.repeats or self._in_flight(rec):
            return None
        d = decide(self.o.metric, self.base.run_samples(), rec.run_samples(),
                   threshold=self.o.threshold, loss_tol=self.o.loss_tol)  # fmt: skip
        if d.verdict == UNDECIDED:
            if rec.runs_done() < self.o.max_repeats:
                return None
            return Decision(SKIP, f"undecided after {rec.runs_done()} runs: {d.why}", d.change)
        return d

    @staticmethod
    def _in_flight(rec: CommitRecord) -> bool:
        return bool(set(rec.batches) - {s["batch"] for s in rec.samples})

    def known(self) -> dict[int, Tested]:
        out = {}
        for i, c in enumerate(self.line):
            rec = self.m.store.commit(c.sha, c.subject)
            d = self.decision(rec)
            if d is not None:
                out[i] = Tested(i, c, d, rec)
        return out

    # -- the loop -----------------------------------------------------------------------

    def run(self) -> Outcome:
        attempts: dict[int, int] = {}
        self.say(f"good {self.good.short} {self.good.subject!r}: the baseline")
        self._progress("running", (-1, self.good), {})
        self.m.measure(self.base, self.o.repeats)
        if not any(s.get("usable") for s in self.base.samples):
            why = build_summary(self.base.build_error) if self.base.build_error else "; ".join(sorted({str(s.get("reason")) for s in self.base.samples}))
            self._progress("failed", None, {}, answer=f"the good commit does not run: {why}")
            raise DstuiError(f"the good commit {self.good.short} does not give a baseline: {why or 'no runs'}")
        while True:
            tested = self.known()
            verdicts = {i: t.decision.verdict for i, t in tested.items()}
            c = conclude(len(self.line), verdicts)
            idx = next_index(len(self.line), verdicts)
            if idx is None:
                out = Outcome(c, self.line, tested)
                self._finish(out)
                return out
            attempts[idx] = attempts.get(idx, 0) + 1
            if attempts[idx] > 2:
                raise DstuiError(f"commit {self.line[idx].short} stays undecided after two attempts; see its batches")
            commit = self.line[idx]
            self.say(f"[{c.left()} outcomes left] testing {commit.short} {commit.subject!r} "
                     f"({idx + 1}/{len(self.line)} after good)")  # fmt: skip
            self._progress("running", (idx, commit), tested)
            self._test(self.m.store.commit(commit.sha, commit.subject))
            t = self.known().get(idx)
            if t is not None:
                change = f"; {t.decision.change}" if t.decision.change else ""
                self.say(f"  -> {t.decision.verdict}: {t.decision.why}{change}")
                if self.tag:
                    self.tag(t, self.session.name)

    def _test(self, rec: CommitRecord) -> None:
        """Runs until the commit is decided: ``repeats`` at first, more while iteration time is undecided."""
        want = max(self.o.repeats, rec.runs_done())
        while True:
            self.m.measure(rec, want)
            d = self.decision(rec)
            if d is not None or rec.build == "failed" or want >= self.o.max_repeats:
                return
            if not rec.samples:
                return
            want = min(self.o.max_repeats, want + self.o.repeats)
            self.say(f"  undecided; {want} runs on each side")
            self.m.measure(self.base, want)

    def _progress(self, state: str, current: tuple[int, Commit] | None, tested: dict[int, Tested], **extra: Any) -> None:
        self._shown = (current, tested)
        verdicts = {i: t.decision.verdict for i, t in tested.items()}
        c = conclude(len(self.line), verdicts)
        cur = None
        if current is not None:
            i, commit = current
            rec = self.m.store.commit(commit.sha)
            cur = {"index": i, "sha": commit.sha, "subject": commit.subject, "batch": (rec.batches or [None])[-1]}
        write_progress(self.session, {
            "id": self.session.name, "pid": os.getpid(), "state": state, "metric": self.o.metric,
            "experiment": self.m.spec.name, "condition": self.m.condition,
            "good": {"sha": self.good.sha, "subject": self.good.subject},
            "bad": {"sha": self.line[-1].sha, "subject": self.line[-1].subject},
            "commits": len(self.line), "left": c.left(), "current": cur,
            "tested": [t.row() for _, t in sorted(tested.items())], **extra,
        })  # fmt: skip

    def _finish(self, out: Outcome) -> None:
        text = report.markdown(self, out)
        path = self.session / report.REPORT_NAME
        path.write_text(text)
        self._progress("done", None, out.tested, answer=out.answer(), report=str(path),
                       first_bad=out.first_bad.sha if out.first_bad else None)  # fmt: skip


def tag_mlflow(t: Tested, session_id: str, say: Callable[[str], None] = print) -> None:
    """Tag a tested commit's MLflow runs with the bisect and its verdict (they already carry the sha)."""
    runs = [s["mlflow_run_id"] for s in t.record.samples if s.get("mlflow_run_id")]
    if not runs:
        return
    from dstui.tracking import client as tracking
    from dstui.tracking import tags as tag_keys

    tags = {tag_keys.BISECT: session_id, tag_keys.BISECT_COMMIT: t.commit.sha,
            tag_keys.BISECT_VERDICT: t.decision.verdict, tag_keys.BISECT_CHANGE: t.decision.change}  # fmt: skip
    try:
        c = tracking.client()
        for rid in runs:
            tracking.set_tags(c, rid, tags)
    except Exception as e:  # MLflow down: the verdict is in the bisect's own files anyway
        say(f"  (MLflow tags not written: {type(e).__name__}: {e})")
