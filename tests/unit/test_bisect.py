"""dstui bisect without DeepSpeed: the search's bounds, decisions against scipy, the store, CLI errors.

The real thing (envs built from DeepSpeed releases, runs, kill + resume) is
tests/e2e/test_bisect.py; here the parts are checked exhaustively and fast.
"""

from __future__ import annotations

import json
import math
import tarfile
from pathlib import Path

import pytest
from helpers import git_at

from dstui.analysis.revision_compare import RunSample
from dstui.bisect import decide as D
from dstui.bisect.search import BAD, GOOD, SKIP, conclude, next_index
from dstui.bisect.store import CommitRecord, Store, list_progress, write_progress
from dstui.core.errors import SpecError
from dstui.spec.settings import Settings


def search(n: int, truth: int, skipped: frozenset[int] = frozenset()) -> tuple[list[int], object]:
    """Run the search against an oracle: commits at index >= truth are bad."""
    verdicts: dict[int, str] = {}
    order = []
    while (i := next_index(n, verdicts)) is not None:
        order.append(i)
        verdicts[i] = SKIP if i in skipped else (BAD if i >= truth else GOOD)
    return order, conclude(n, verdicts)


@pytest.mark.parametrize("n", range(1, 34))
def test_search_is_exact_within_log2_of_outcomes(n: int) -> None:
    for truth in range(n + 1):  # truth == n: no regression
        order, c = search(n, truth)
        assert c.first_bad == truth, (n, truth, order)
        # with the good commit's own env: ceil(log2(N)) + 1 envs, N = commits including good
        assert len(order) <= math.ceil(math.log2(n + 1)), (n, truth, order)
        assert len(set(order)) == len(order)


def test_skips_are_stepped_around() -> None:
    # the e2e history: [B, C, X, D], X does not build, C is the culprit
    order, c = search(4, truth=1, skipped=frozenset({2}))
    assert order == [2, 1, 0] and c.first_bad == 1
    for n in range(2, 20):
        for truth in range(n + 1):
            for skip in range(n):
                order, c = search(n, truth, frozenset({skip}))
                if c.first_bad is not None:
                    assert c.first_bad == truth, (n, truth, skip)
                else:  # only when the skipped commit sits right before the culprit (or is it)
                    assert truth in c.suspects or truth == n, (n, truth, skip, c)
                    assert skip in c.suspects


def test_search_trusts_the_newest_good_mark() -> None:
    c = conclude(5, {3: GOOD, 1: BAD})
    assert (c.lo, c.hi, c.done) == (4, 5, False)


def _runs(means: list[float], *, loss: dict[int, float] | None = None, mem: float = 1e9) -> list[RunSample]:
    return [RunSample("c", "r", m, mem, dict(loss or {1: 2.0, 2: 1.9}), True) for m in means]


def test_iter_time_decisions_follow_welch() -> None:
    from scipy import stats

    base = [1.00, 1.01, 0.99, 1.005]
    slow = [1.20, 1.21, 1.19, 1.195]
    d = D.decide("iter_time", _runs(base), _runs(slow), threshold=0.05, loss_tol=1e-3)
    p = stats.ttest_ind(slow, base, equal_var=False).pvalue
    assert d.verdict == BAD and f"p={p:.2g}" in d.change and d.change.startswith("+19.")
    assert "95% CI" in d.change
    same = [1.002, 0.998, 1.006, 0.999]
    assert D.decide("iter_time", _runs(base), _runs(same), threshold=0.05, loss_tol=1e-3).verdict == GOOD
    noisy = [0.9, 1.3, 1.0, 1.2]  # the interval reaches +5%: more runs needed
    assert D.decide("iter_time", _runs(base), _runs(noisy), threshold=0.05, loss_tol=1e-3).verdict == D.UNDECIDED
    one = D.decide("iter_time", _runs(base), _runs([1.3]), threshold=0.05, loss_tol=1e-3)
    assert one.verdict == D.UNDECIDED and "fewer than 2" in one.why


def test_loss_memory_and_crashes() -> None:
    base = _runs([1.0], loss={1: 2.0, 2: 1.9, 3: 1.8})
    moved = _runs([1.0], loss={1: 2.0, 2: 1.95, 3: 1.8})
    d = D.decide("loss", base, moved, threshold=0.05, loss_tol=1e-3)
    assert d.verdict == BAD and "0.05 at step 2" in d.change
    assert D.decide("loss", base, base, threshold=0.05, loss_tol=1e-3).verdict == GOOD
    nan = _runs([1.0], loss={1: 2.0, 2: float("nan"), 3: 1.8})
    assert D.decide("loss", base, nan, threshold=0.05, loss_tol=1e-3).verdict == BAD  # NaN is never parity
    crashed = [RunSample("c", "r", None, None, {}, False)]
    assert D.decide("loss", base, crashed, threshold=0.05, loss_tol=1e-3).verdict == SKIP
    grown = D.decide("mem_peak", _runs([1.0], mem=2**30), _runs([1.0], mem=1.25 * 2**30), threshold=0.1, loss_tol=1e-3)
    assert grown.verdict == BAD and grown.change == "+25.0% peak memory (+0.250 GiB)"
    assert D.decide("mem_peak", _runs([1.0], mem=2**30), _runs([1.0], mem=1.05 * 2**30), threshold=0.1,
                    loss_tol=1e-3).verdict == GOOD  # fmt: skip


def test_store_round_trip_and_progress(tmp_path: Path) -> None:
    s = Settings(model="tiny-llama")
    store = Store.for_condition(tmp_path, "exp", "z0", s)
    assert store.root.parent == tmp_path / "bisect" and store.root.name.startswith("exp-z0-")
    assert Store.for_condition(tmp_path, "exp", "z0", Settings(model="tiny-llama", steps=3)).root != store.root
    rec = store.commit("a" * 40, "subject")
    assert (rec.build, rec.samples) == ("", [])
    rec.build, rec.builds, rec.batches = "ok", 1, ["b1"]
    rec.samples.append({"batch": "b1", "usable": True, "iter_time_mean": 0.5, "mem_peak": 10.0, "loss": {"1": 2.5}})
    store.save(rec)
    again = store.commit("a" * 40)
    assert again == rec
    assert again.run_samples() == [RunSample("c", "a" * 40, 0.5, 10.0, {1: 2.5}, True)]
    session = store.session_dir("a" * 40, "b" * 40, "loss")
    write_progress(session, {"state": "running", "left": 3})
    found = list_progress(tmp_path)
    assert len(found) == 1 and found[0]["left"] == 3 and found[0]["folder"] == str(session)
    assert isinstance(CommitRecord("x").run_samples(), list)


def linear_repo(repo: Path, commits: int) -> Path:
    """A git repository on branch main with ``commits`` commits of one file (c0, c1, ...)."""
    repo.mkdir()
    git_at(repo, "init", "-q", "-b", "main")
    for i in range(commits):
        (repo / "f").write_text(str(i))
        git_at(repo, "add", "f")
        git_at(repo, "commit", "-q", "-m", f"c{i}")
    return repo


def test_first_parent_line_and_cli_errors(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dstui import cli
    from dstui.core.errors import SpecError
    from dstui.revisions.history import first_parent_line

    repo = linear_repo(home / "repo", 4)
    git_at(repo, "checkout", "-q", "-b", "side", "HEAD~2")
    (repo / "g").write_text("side")
    git_at(repo, "add", "g")
    git_at(repo, "commit", "-q", "-m", "side work")
    git_at(repo, "checkout", "-q", "main")
    git_at(repo, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    good, line = first_parent_line(repo, "HEAD~3", "HEAD")
    assert good.subject == "c1" and [c.subject for c in line] == ["c2", "c3", "merge side"]
    with pytest.raises(SpecError, match="unknown git ref 'nope'"):
        first_parent_line(repo, "nope", "HEAD")
    with pytest.raises(SpecError, match="not an ancestor"):
        first_parent_line(repo, "HEAD", "HEAD~2")
    with pytest.raises(SpecError, match="not on the first-parent line"):
        first_parent_line(repo, "side", "HEAD")
    spec = home / "s.yaml"
    spec.write_text(json.dumps({"name": "b", "conditions": [{"name": "z0"}]}))
    base = ["bisect", str(spec), "--repo", str(repo), "--good", "HEAD~3", "--bad", "HEAD", "--no-validate"]
    assert cli.main([*base, "--condition", "zz", "--metric", "loss"]) == 2
    assert "zz" in capsys.readouterr().err
    assert cli.main([*base, "--condition", "z0", "--metric", "iter_time", "--repeats", "1"]) == 2
    assert "--repeats" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main([*base, "--condition", "z0", "--metric", "loss", "--threshold", "lots"])
    assert "not a threshold" in capsys.readouterr().err


class SyntheticMeasurer:
    """Stands in for building and running (tests/e2e/test_bisect.py does those for real).

    Iteration times are drawn around 1.0 s before the culprit and 1.2 s from it on;
    ``noisy`` commits need more repeats before the interval excludes +5%.
    """

    def __init__(self, store: Store, shas: list[str], culprit: int, noisy: set[int]) -> None:
        import numpy as np

        from dstui.spec.experiment import ExperimentSpec

        self.store, self.shas, self.culprit, self.noisy = store, shas, culprit, noisy
        self.spec, self.condition, self.repo = ExperimentSpec(name="exp"), "z0", Path("/repo")
        self.rng = np.random.default_rng(1)
        self.calls: list[tuple[str, int]] = []
        self.on_batch = None
        self.progress_seen: list[tuple[str, str]] = []  # (commit under test, its batch) in progress.json

    def measure(self, rec: CommitRecord, repeats: int) -> None:
        i = self.shas.index(rec.sha)
        self.calls.append((rec.sha, repeats))
        while rec.runs_done() < repeats:
            level = 1.2 if i >= self.culprit else 1.0
            spread = 0.04 if i in self.noisy else 0.005
            rec.batches.append(f"b{len(rec.batches)}")
            self.store.save(rec)
            if self.on_batch:
                self.on_batch(rec)
                cur = json.loads((self.session / "progress.json").read_text())["current"]
                self.progress_seen.append((cur["sha"], cur["batch"]))
            rec.samples.append({"batch": rec.batches[-1], "usable": True, "mem_peak": 1.0, "loss": {"1": 2.0},
                                "iter_time_mean": float(level + self.rng.normal(0, spread))})  # fmt: skip
        self.store.save(rec)


def test_iter_time_session_adds_repeats_and_is_replayed(tmp_path: Path) -> None:
    from dstui.bisect.session import Bisect, Options
    from dstui.revisions.history import Commit

    shas = [f"{i:040x}" for i in range(9)]  # shas[0] is good
    store = Store(tmp_path / "store")
    m = SyntheticMeasurer(store, shas, culprit=6, noisy={5})
    m.session = tmp_path / "s"
    line = [Commit(s, f"commit {i}") for i, s in enumerate(shas) if i]
    opts = Options("iter_time", 0.05, 1e-3, repeats=3, max_repeats=9)
    lines: list[str] = []
    out = Bisect(m, Commit(shas[0], "good"), line, opts, tmp_path / "s", say=lines.append).run()  # type: ignore[arg-type]
    assert out.first_bad == line[5] and out.regression is True
    assert out.answer().startswith(f"first bad commit: {shas[6][:12]} 'commit 6': +")
    assert "95% CI" in out.answer()
    tested = {line[i].sha: t for i, t in out.tested.items()}
    assert len(tested) <= math.ceil(math.log2(len(line) + 1))
    assert tested[shas[5]].record.runs_done() > 3, "the noisy commit needed more repeats"
    assert any("undecided" in ln for ln in lines)
    assert (shas[5], "b0") in m.progress_seen and (shas[5], "b3") in m.progress_seen  # live batch ids
    assert (tmp_path / "s" / "report.md").read_text().count("| `") == len(tested) + 1
    # Started again: replayed from the records, nothing measured beyond asking for what is there.
    m.calls.clear()
    again = Bisect(m, Commit(shas[0], "good"), line, opts, tmp_path / "s", say=lines.append).run()  # type: ignore[arg-type]
    assert again.first_bad == out.first_bad
    assert all(store.commit(sha).runs_done() >= n for sha, n in m.calls)  # every call was already satisfied
    assert json.loads((tmp_path / "s" / "progress.json").read_text())["state"] == "done"


def test_build_summary_names_the_cause() -> None:
    from dstui.bisect.session import build_summary

    error = (
        "revision 'abc': building its environment failed (Command '[...]' returned non-zero exit status 1.)\n"
        "  build log: /c/envs/git-abc.build.log (last 40 lines below)\n"
        "      ╰─> [1 lines of output]\n          SETUP-SAYS-NO: cannot build\n          [end of output]\n"
        "      error: metadata-generation-failed\n"
    )
    assert build_summary(error) == "revision 'abc': building its environment failed: SETUP-SAYS-NO: cannot build"
    assert build_summary("boom\n  error: x") == "boom: error: x"


# -- issue 30: verdicts, recorded metrics, the release walk, progress ------------------------------------


def test_verdict_decisions() -> None:
    from dstui.bisect.decide import verdict_decision

    passed = {"verdict": "PASS", "check": "verify", "usable": True}
    failed = {"verdict": "FAIL", "check": "verify", "first_diverging_step": 2, "verdict_reason": "grad x.w off",
              "usable": True}  # fmt: skip
    crashed = {"state": "failed", "reason": "exit 1: RuntimeError", "usable": False}
    assert verdict_decision([passed, passed]).verdict == GOOD
    bad = verdict_decision([passed, failed])
    assert bad.verdict == BAD and bad.change == "verify FAIL at step 2: grad x.w off" and "1 of 2" in bad.why
    skip = verdict_decision([crashed])
    assert skip.verdict == SKIP and "RuntimeError" in skip.why
    assert verdict_decision([{"verdict": "PASS", "check": "sp-check"}]).change == "sp-check PASS"
    assert verdict_decision([{"verdict": "maybe"}]).verdict == SKIP  # a runner's odd output is no verdict


def test_recorded_metric_series_and_decisions() -> None:
    from dstui.bisect.decide import Threshold, check_recorded_name, metric_decision
    from dstui.bisect.measure import recorded_fields, recorded_series

    recs = [
        {"type": "header", "model": "x"},
        {"type": "step", "step": 1, "grad_norm": 4.0, "grad_norm_baseline": 2.0, "loss": 6.0},
        {"type": "step", "step": 2, "grad_norm": 3.0, "grad_norm_baseline": 0.0, "loss": "junk"},
        {"type": "step", "step": "3", "grad_norm": 1.0},  # a bad step number: left out
        {"type": "summary", "grad_max_abs_diff_max": 0.5, "verdict": "FAIL"},
    ]
    assert recorded_series(recs, "grad_norm/grad_norm_baseline") == {1: 2.0}  # zero denominator left out
    assert recorded_series(recs, "grad_norm") == {1: 4.0, 2: 3.0}
    assert recorded_series(recs, "loss") == {1: 6.0}
    assert recorded_series(recs, "grad_max_abs_diff_max") == {0: 0.5}
    assert recorded_series(recs, "nothing") == {}
    assert "grad_norm_baseline" in recorded_fields(recs) and "verdict" not in recorded_fields(recs)

    base = [{1: 1.0, 2: 1.0}, {1: 1.0, 2: 1.02}]
    d = metric_decision("r", base, [{1: 2.0, 2: 2.0}], Threshold(0.5))
    assert d.verdict == BAD and "largest |difference| from good 1 at step 1" in d.change
    assert metric_decision("r", base, [{1: 1.2, 2: 1.0}], Threshold(0.5)).verdict == GOOD
    rel = metric_decision("r", base, [{1: 1.2, 2: 1.0}], Threshold(0.1, relative=True))
    assert rel.verdict == BAD and "20%" in rel.change and "threshold 10%" in rel.change
    assert metric_decision("r", base, [{1: float("nan")}], Threshold(1e9)).verdict == BAD  # NaN is never close
    assert metric_decision("r", base, [{7: 1.0}], Threshold(1)).verdict == SKIP
    assert metric_decision("r", [{0: 0.0}], [{0: 0.0}], Threshold(0.1, relative=True)).verdict == GOOD
    assert check_recorded_name("grad_norm/grad_norm_baseline") is None and check_recorded_name("a.b") is None
    assert "ratio" in (check_recorded_name("a/b/c") or "") and check_recorded_name("x; rm -rf") is not None


def test_release_line_and_names() -> None:
    from dstui.bisect.releases import Release, is_release, release_line

    assert is_release("0.18.0") and is_release("0.16") and not is_release("v0.18.0") and not is_release("master")
    avail = ["0.19.0", "0.18.2", "0.18.10", "0.18.1", "0.18.0", "0.17.6", "junk"]
    good, line = release_line("0.18.0", "0.18.10", avail)
    assert good == Release.of("0.18.0") and [r.short for r in line] == ["0.18.1", "0.18.2", "0.18.10"]
    assert line[0].sha == "pypi-0.18.1" and line[0].subject == "DeepSpeed 0.18.1 (PyPI)"
    assert [r.short for r in release_line("0.18", "0.19", avail)[1]][-1] == "0.19.0"  # 0.18 == 0.18.0
    with pytest.raises(SpecError, match="lists no DeepSpeed release '0.18.7'"):
        release_line("0.18.7", "0.19.0", avail)
    with pytest.raises(SpecError, match="older release"):
        release_line("0.19.0", "0.18.0", avail)


def test_session_folder_names(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    assert store.session_dir("pypi-0.16.0", "pypi-0.18.0", "verdict").name == "0.16.0-0.18.0-verdict"
    odd = store.session_dir("a" * 40, "b" * 40, "grad_norm/grad_norm_baseline")
    assert odd.name == f"{'a' * 10}-{'b' * 10}-grad_norm_grad_norm_baseline" and odd.parent == store.root


def test_search_path_and_estimate() -> None:
    from dstui.bisect.search import path, tests_left

    verdicts: dict[int, str] = {}
    order = []
    while (i := next_index(6, verdicts)) is not None:  # the e2e history: K skip, C bad, G bad, B good
        order.append(i)
        verdicts[i] = {3: SKIP, 2: BAD, 1: BAD, 0: GOOD}[i]
    assert order == [3, 2, 1, 0] and path(6, verdicts) == order
    assert path(6, {3: SKIP, 2: BAD, 5: GOOD}) == [3, 2]  # stops at the first undecided step; 5 is off the path
    assert tests_left(conclude(6, {})) == 3 and tests_left(conclude(6, verdicts)) == 0
    assert tests_left(conclude(1, {})) == 1


def test_available_releases_from_a_local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The release list is pip's (`pip index versions`): here a find-links folder, no network."""
    from dstui.bisect.releases import available_releases

    for v in ("0.17.9", "0.18.0", "0.18.1"):
        with tarfile.open(tmp_path / f"deepspeed-{v}.tar.gz", "w:gz"):
            pass
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    assert available_releases()[:3] == ["0.18.1", "0.18.0", "0.17.9"]


def test_cli_refuses_bad_metric_combinations(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dstui import cli

    repo = linear_repo(home / "repo", 2)
    spec = home / "s.yaml"
    spec.write_text(json.dumps({"name": "b", "conditions": [{"name": "z0"}, {"name": "v", "kind": "verify"},
                                                           {"name": "sp", "sp_check": True}]}))  # fmt: skip
    base = ["bisect", str(spec), "--repo", str(repo), "--good", "HEAD~1", "--bad", "HEAD", "--no-validate"]
    assert cli.main([*base, "--condition", "z0", "--metric", "verdict"]) == 2
    assert "--metric verdict needs a condition whose runs give a verdict (kind: verify, or sp_check: true)" in capsys.readouterr().err
    assert cli.main([*base, "--condition", "v", "--metric", "verdict", "--threshold", "5%"]) == 2
    assert "takes no --threshold" in capsys.readouterr().err
    assert cli.main([*base, "--condition", "v", "--metric", "grad_norm"]) == 2
    assert "--metric grad_norm needs --threshold" in capsys.readouterr().err
    assert cli.main([*base, "--condition", "v", "--metric", "a/b/c", "--threshold", "1"]) == 2
    assert "is neither" in capsys.readouterr().err
    import argparse

    from dstui.commands.bisect import _check_metric

    def check(metric: str, settings: Settings, threshold: tuple[float, bool] | None = None) -> tuple[float, bool]:
        return _check_metric(argparse.Namespace(metric=metric, threshold=threshold, condition="c"), settings)

    assert check("verdict", Settings(sp_check=True)) == (0.0, False)  # Ulysses sp-check gives a verdict too
    assert check("verdict", Settings(kind="verify")) == (0.0, False)
    assert check("grad_max_abs_diff", Settings(), (1e-6, False)) == (1e-6, False)
    assert check("iter_time", Settings(), (0.05, False)) == (0.05, True)  # iter_time: always relative


class VerdictMeasurer:
    """Verdicts from an oracle (PASS before ``culprit``, FAIL from it on; ``crash`` gives none)."""

    def __init__(self, store: Store, shas: list[str], culprit: int, crash: set[int], good_fails: bool = False) -> None:
        from dstui.spec.experiment import ExperimentSpec

        self.store, self.shas, self.culprit, self.crash, self.good_fails = store, shas, culprit, crash, good_fails
        self.spec, self.condition, self.repo = ExperimentSpec(name="exp"), "v", Path("/repo")
        self.on_batch = self.on_build = None
        self.measured: list[int] = []

    def measure(self, rec: CommitRecord, repeats: int) -> None:
        i = self.shas.index(rec.sha)
        while rec.runs_done() < repeats:
            self.measured.append(i)
            rec.batches.append(f"b{i}")
            if i in self.crash:
                rec.samples.append({"batch": f"b{i}", "usable": False, "state": "failed", "reason": "crashed"})
            else:
                bad = i >= self.culprit or (i == 0 and self.good_fails)
                rec.samples.append({"batch": f"b{i}", "usable": True, "verdict": "FAIL" if bad else "PASS"})
        self.store.save(rec)


def test_verdict_session_runs_the_good_end_only_when_the_answer_rests_on_it(tmp_path: Path) -> None:
    from dstui.bisect.session import Bisect, Options
    from dstui.core.errors import DstuiError
    from dstui.revisions.history import Commit

    shas = [f"{i:040x}" for i in range(8)]
    line = [Commit(s, f"commit {i}") for i, s in enumerate(shas) if i]
    opts = Options("verdict", 0.0, 1e-3, repeats=1, max_repeats=1, relative=False)
    m = VerdictMeasurer(Store(tmp_path / "a"), shas, culprit=4, crash={2})
    out = Bisect(m, Commit(shas[0], "good"), line, opts, tmp_path / "a" / "s", say=lambda s: None).run()  # type: ignore[arg-type]
    assert out.first_bad == line[3] and 0 not in m.measured and 2 in m.measured
    assert out.answer() == f"first bad commit: {shas[4][:12]} 'commit 4': verify FAIL"
    # the first candidate is the culprit: the good end is run, once, to rule out an older bug
    m = VerdictMeasurer(Store(tmp_path / "b"), shas, culprit=1, crash=set())
    out = Bisect(m, Commit(shas[0], "good"), line, opts, tmp_path / "b" / "s", say=lambda s: None).run()  # type: ignore[arg-type]
    assert out.first_bad == line[0] and m.measured.count(0) == 1
    m = VerdictMeasurer(Store(tmp_path / "c"), shas, culprit=1, crash=set(), good_fails=True)
    with pytest.raises(DstuiError, match="FAILs its check too"):
        Bisect(m, Commit(shas[0], "good"), line, opts, tmp_path / "c" / "s", say=lambda s: None).run()  # type: ignore[arg-type]
    # the release walk's commits: the good end was shown good already, never run
    m = VerdictMeasurer(Store(tmp_path / "d"), shas, culprit=1, crash=set(), good_fails=True)
    out = Bisect(m, Commit(shas[0], "good"), line, opts, tmp_path / "d" / "s", say=lambda s: None,  # type: ignore[arg-type]
                 good_known=True, context="narrowed by the release walk").run()  # fmt: skip
    assert out.first_bad == line[0] and 0 not in m.measured
    report = (tmp_path / "d" / "s" / "report.md").read_text()
    assert "narrowed by the release walk" in report and "search path" in report and "good (shown before)" in report


def test_a_release_tag_is_found_as_v_version_or_version_and_named_when_missing(tmp_path: Path) -> None:
    from dstui.bisect.releases import release_tag

    git_at(tmp_path, "init", "-q")
    (tmp_path / "f").write_text("x")
    git_at(tmp_path, "add", "f")
    git_at(tmp_path, "commit", "-q", "-m", "one", date=1)
    git_at(tmp_path, "tag", "v0.18.1")
    git_at(tmp_path, "tag", "0.18.2")
    git_at(tmp_path, "branch", "v0.18.3")  # a branch of that name is not a release tag
    assert release_tag(tmp_path, "0.18.1") == "v0.18.1"
    assert release_tag(tmp_path, "0.18.2") == "0.18.2"
    with pytest.raises(SpecError, match="no tag v0.18.3 \\(or 0.18.3\\) for release 0.18.3"):
        release_tag(tmp_path, "0.18.3")
