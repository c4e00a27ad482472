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
from dstui.bisect.decide import (
    UNDECIDED,
    VERDICT,
    Decision,
    Threshold,
    decide,
    is_recorded,
    metric_decision,
    verdict_decision,
)
from dstui.bisect.measure import Measurer, recorded_fields
from dstui.bisect.search import BAD, SKIP, Conclusion, conclude, next_index, path, tests_left
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
    relative: bool = True  # a recorded metric's threshold: relative (5%) or absolute (0.01)

    @property
    def limit(self) -> Threshold:
        """The threshold as a recorded metric's decision reads it (and the report shows it)."""
        return Threshold(self.threshold, self.relative)

    @property
    def needs_base(self) -> bool:
        """A verdict is absolute; every other metric is judged against the good end's runs."""
        return self.metric != VERDICT


@dataclass
class Tested:
    index: int  # -1 = the good commit
    commit: Commit
    decision: Decision
    record: CommitRecord

    def row(self) -> dict[str, Any]:
        return {
            "index": self.index, "sha": self.commit.sha, "name": self.commit.short, "subject": self.commit.subject,
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
    noun: str = "commit"  # or "release" (the release walk)

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
            return f"first bad {self.noun}: {bad.short} {bad.subject!r}: {t.decision.change}"
        if self.regression is False:
            return "no regression found between good and bad"
        names = ", ".join(f"{self.line[i].short} {self.line[i].subject!r}" for i in self.conclusion.suspects)
        maybe_none = "" if self.conclusion.hi < len(self.line) else " (or no regression)"
        return f"the first bad {self.noun} could not be isolated: it is one of {names}{maybe_none}"


class Bisect:
    """One search over ``good..bad`` (the first-parent ``line``, oldest first, ending at bad).

    ``noun`` says what the line holds ("commit", or "release" for the release
    walk); ``good_known`` that the good end was already shown good (the release
    walk's last good release, before its commits are walked), so a verdict
    bisect need not run it; ``context`` is a line for the report.
    """

    def __init__(self, measurer: Measurer, good: Commit, line: list[Commit], options: Options, session: Path,
                 say: Callable[[str], None] = print, tag: Callable[[Tested, str], None] | None = None,
                 noun: str = "commit", good_known: bool = False, context: str = "") -> None:  # fmt: skip
        self.m, self.good, self.line, self.o = measurer, good, line, options
        self.session, self.say, self.tag = session, say, tag
        self.noun, self.good_known, self.context = noun, good_known, context
        self.base: CommitRecord = measurer.store.commit(good.sha, good.subject)
        self._shown: tuple[tuple[int, Commit] | None, dict[int, Tested]] = (None, {})
        # the progress file names the batch of the commit under test as soon as it exists
        measurer.on_batch = lambda rec: self._progress("running", *self._shown, phase="running")
        measurer.on_build = lambda rec: self._progress("running", *self._shown, phase="building")

    # -- verdicts from what is on disk ------------------------------------------------

    def decision(self, rec: CommitRecord) -> Decision | None:
        """The verdict the records support now; None when the commit still needs runs."""
        if rec.build == "failed":
            return Decision(SKIP, f"does not build: {build_summary(rec.build_error)}")
        if not rec.samples or rec.runs_done() < self.o.repeats or self._in_flight(rec):
            return None
        if self.o.metric == VERDICT:
            return verdict_decision(rec.samples)
        if is_recorded(self.o.metric):
            if not any(s.get("usable") for s in rec.samples):
                return Decision(SKIP, "no run finished (crashed)")
            return metric_decision(self.o.metric, self.m.series(self.base, self.o.metric),
                                   self.m.series(rec, self.o.metric), self.o.limit)  # fmt: skip
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

    def _baseline(self) -> None:
        """Measure the good end; it must run (and, for a recorded metric, have recorded it)."""
        self.say(f"good {self.good.short} {self.good.subject!r}: the baseline")
        self._progress("running", (-1, self.good), self._shown[1])
        self.m.measure(self.base, self.o.repeats)
        if not any(s.get("usable") for s in self.base.samples):
            why = build_summary(self.base.build_error) if self.base.build_error else "; ".join(sorted({str(s.get("reason")) for s in self.base.samples}))
            self._progress("failed", None, {}, answer=f"the good {self.noun} does not run: {why}")
            raise DstuiError(f"the good {self.noun} {self.good.short} does not give a baseline: {why or 'no runs'}")
        if is_recorded(self.o.metric) and not self.m.series(self.base, self.o.metric):
            fields = sorted({f for s in self.base.samples for f in recorded_fields(self.m.records(s))})
            self._progress("failed", None, {}, answer=f"the good {self.noun}'s runs recorded no {self.o.metric}")
            raise DstuiError(f"--metric {self.o.metric}: the good {self.noun}'s runs recorded no such value; "
                             f"they record: {', '.join(fields[:40]) or 'nothing'} (or a ratio a/b of two)")  # fmt: skip

    def _confirm_good(self) -> None:
        """A verdict bisect whose answer is the first candidate rests on the good end PASSing: check it once."""
        self.say(f"the answer is the first {self.noun} after good: checking that good {self.good.short} PASSes")
        self._progress("running", (-1, self.good), self._shown[1])
        self.m.measure(self.base, self.o.repeats)
        d = verdict_decision(self.base.samples) if self.base.build != "failed" else Decision(
            SKIP, f"does not build: {build_summary(self.base.build_error)}")  # fmt: skip
        if d.verdict == BAD:
            self._progress("failed", None, self._shown[1], answer=f"the good {self.noun} FAILs too")
            raise DstuiError(f"the good {self.noun} {self.good.short} FAILs its check too ({d.change}): "
                             f"the bug is older; pick an older --good")  # fmt: skip
        if d.verdict == SKIP:
            self._progress("failed", None, self._shown[1], answer=f"the good {self.noun} gives no verdict")
            raise DstuiError(f"the good {self.noun} {self.good.short} gives no verdict ({d.why}); "
                             "the first bad one cannot be told from an older bug")  # fmt: skip

    def run(self) -> Outcome:
        attempts: dict[int, int] = {}
        if self.o.needs_base:
            self._baseline()
        while True:
            tested = self.known()
            verdicts = {i: t.decision.verdict for i, t in tested.items()}
            c = conclude(len(self.line), verdicts)
            idx = next_index(len(self.line), verdicts)
            if idx is None:
                if not self.o.needs_base and c.first_bad == 0 and not self.good_known:
                    self._shown = (None, tested)
                    self._confirm_good()
                out = Outcome(c, self.line, tested, noun=self.noun)
                self._finish(out)
                return out
            attempts[idx] = attempts.get(idx, 0) + 1
            if attempts[idx] > 2:
                raise DstuiError(f"commit {self.line[idx].short} stays undecided after two attempts; see its batches")
            commit = self.line[idx]
            self.say(f"[{c.left()} outcomes left, about {tests_left(c)} more tests] testing {self.noun} "
                     f"{commit.short} {commit.subject!r} ({idx + 1}/{len(self.line)} after good)")  # fmt: skip
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
            cur = {"index": i, "sha": commit.sha, "name": commit.short, "subject": commit.subject,
                   "batch": (rec.batches or [None])[-1]}  # fmt: skip
        write_progress(self.session, {
            "id": self.session.name, "pid": os.getpid(), "state": state, "metric": self.o.metric,
            "experiment": self.m.spec.name, "condition": self.m.condition,
            "good": {"sha": self.good.sha, "name": self.good.short, "subject": self.good.subject},
            "bad": {"sha": self.line[-1].sha, "name": self.line[-1].short, "subject": self.line[-1].subject},
            "commits": len(self.line), "left": c.left(), "current": cur, "noun": self.noun,
            "tests_left": tests_left(c), "tested": [t.row() for _, t in sorted(tested.items())],
            "path": [{"sha": self.line[i].sha, "name": self.line[i].short, "verdict": verdicts[i]}
                     for i in path(len(self.line), verdicts)],
            **extra,
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
